"""One hook command run to its end or its timeout: JSON on stdin, stdout and stderr read apart.

The command runs in a process group of its own; past its timeout the whole group is killed, so a
hook that started a child does not leave it running. A hook that exits counts at once, with its
exit code, even while a child it left in the background holds its output open (that child is
killed with the group once the output has had :data:`_DRAIN_S` to end). Of each stream the first
:data:`READ_LIMIT` bytes are kept; the rest is read and dropped (a hook writing without end never
blocks on a full pipe, nor fills memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass

#: Bytes of each of stdout and stderr kept from one hook run.
READ_LIMIT = 64 * 1024
#: Seconds the streams may stay open once the hook exited or was killed (a grandchild that
#: escaped its group still holding them).
_DRAIN_S = 2.0
#: How often the hook is looked at to see whether it exited.
_POLL_S = 0.02


@dataclass(frozen=True)
class Finished:
    """How one run ended: ``exit_code`` (None: killed or never started), the kept output,
    whether it ``timed_out``, and ``error`` when it could not start."""

    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    error: str = ""
    dropped: int = 0  # bytes of output read past READ_LIMIT and not kept


async def run_command(
    argv: list[str], stdin: bytes, *, cwd: str | None, env: dict[str, str], timeout_s: float
) -> Finished:
    """Run ``argv`` with ``stdin`` as its input (see the module docstring)."""
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return Finished(None, "", "", time.monotonic() - started, error=f"it could not start: {exc}")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    dropped = [0]
    stdout, stderr = bytearray(), bytearray()
    readers = asyncio.gather(_read(proc.stdout, stdout, dropped), _read(proc.stderr, stderr, dropped))
    timed_out = False
    try:
        async with asyncio.timeout(timeout_s):
            await _feed(proc.stdin, stdin)
            await _exited(proc)
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_S):
                    await _exited(proc)
    try:
        async with asyncio.timeout(_DRAIN_S):
            await readers
    except TimeoutError:  # a child it left running holds the pipes: killed with its group
        _kill_group(proc.pid)
        readers.cancel()
    return Finished(
        None if timed_out else proc.returncode,
        stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
        round(time.monotonic() - started, 3),
        timed_out,
        dropped=dropped[0],
    )


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the hook itself exited (``proc.wait()`` would also wait for its pipes to close, which
    a child it left in the background may hold open: its exit code would come only at the timeout)."""
    while proc.returncode is None:
        await asyncio.sleep(_POLL_S)


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    """Write the input and close it; a hook that exits without reading it is no failure."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()


async def _read(stream: asyncio.StreamReader, kept: bytearray, dropped: list[int]) -> None:
    while chunk := await stream.read(65536):
        room = max(READ_LIMIT - len(kept), 0)
        kept += chunk[:room]
        dropped[0] += len(chunk) - len(chunk[:room])


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
