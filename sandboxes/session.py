"""Host side of the runner protocol: one long-lived session per sandbox.

:class:`SessionSandbox` implements the :class:`Sandbox` operations over a :class:`RunnerSession`;
the backends only create the runner (a host subprocess or a container) and connect its pipes.
:class:`RunnerSession` sends JSON-line requests to the runner (:mod:`clover_agent.sandboxes.runner`)
and matches responses by id, whatever carries the bytes: a local subprocess's pipes or a Docker
attach socket. A reader thread turns incoming bytes into lines and hands each response to the event
loop that is waiting for it, so many requests may be in flight at once.
"""

from __future__ import annotations

import asyncio
import base64
import errno as errno_codes
import itertools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from clover_agent.sandboxes.base import ExecResult, FileEntry, Sandbox, SandboxError
from clover_agent.sandboxes.workspace import BASELINE_SCRIPT, diff_script

#: The runner's source, sent as the first stdin line to :data:`BOOTSTRAP`.
RUNNER_SOURCE = (Path(__file__).parent / "runner.py").read_text()
#: ``python3 -c BOOTSTRAP WORKSPACE_ROOT`` starts a runner from the source on its first stdin line.
BOOTSTRAP = "import sys,json;exec(compile(json.loads(sys.stdin.readline()),'clover-runner','exec'))"

_ERRORS: dict[str, type[OSError]] = {
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError,
    "PermissionError": PermissionError,
    "FileExistsError": FileExistsError,
}


class RunnerSession:
    """Talks to one runner. ``send`` writes raw bytes to its stdin; ``feed``/``feed_eof`` are called
    by the transport's reader thread with what its stdout produced.

    ``on_lost`` (optional) is called once, from the reader thread, when the runner's stdout ends;
    it returns a short explanation (e.g. "the container was killed: out of memory") used in the
    errors raised for pending and later requests.
    """

    def __init__(self, send: Callable[[bytes], None], on_lost: Callable[[], str] | None = None) -> None:
        self._send = send
        self._send_lock = threading.Lock()
        self._on_lost = on_lost
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._pending_lock = threading.Lock()
        self._buffer = bytearray()
        self._lost: str | None = None
        self._ready = threading.Event()
        self.stderr_tail = bytearray()  # what the runner wrote to stderr, for error messages

    # --- transport side (reader thread) ---------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if line.strip():
                self._dispatch(json.loads(line))

    def feed_stderr(self, data: bytes) -> None:
        self.stderr_tail += data
        del self.stderr_tail[:-4096]

    def feed_eof(self) -> None:
        reason = "the sandbox runner exited"
        if self._on_lost is not None:
            try:
                reason = self._on_lost() or reason
            except Exception as exc:  # the explanation is best effort; the loss itself is certain
                reason = f"{reason} ({exc})"
        stderr = self.stderr_tail.decode("utf-8", "replace").strip()
        if stderr:
            reason = f"{reason}; runner stderr: {stderr[-800:]}"
        self._lost = reason
        self._ready.set()
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for loop, future in pending.values():
            _call_soon(loop, _fail, future, SandboxError(reason))

    def _dispatch(self, message: dict) -> None:
        if message.get("id") == 0:
            self._ready.set()
            return
        with self._pending_lock:
            waiter = self._pending.pop(message.get("id"), None)
        if waiter is not None:
            loop, future = waiter
            _call_soon(loop, _resolve, future, message)

    # --- caller side ----------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        """Send the runner's source and wait (blocking) for its ready line."""
        self._write(json.dumps(RUNNER_SOURCE).encode() + b"\n")
        if not self._ready.wait(timeout):
            raise SandboxError(f"the sandbox runner did not start within {timeout:g} s")
        if self._lost:
            raise SandboxError(f"the sandbox runner failed to start: {self._lost}")

    @property
    def lost(self) -> str | None:
        """Why the runner is gone, or None while it is alive."""
        return self._lost

    def _write(self, data: bytes) -> None:
        with self._send_lock:
            self._send(data)

    async def request(self, op: str, **fields: object) -> dict:
        if self._lost:
            raise SandboxError(self._lost)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        request_id = next(self._ids)
        with self._pending_lock:
            self._pending[request_id] = (loop, future)
        try:
            self._write(json.dumps({"id": request_id, "op": op, **fields}).encode() + b"\n")
        except OSError as exc:
            with self._pending_lock:
                self._pending.pop(request_id, None)
            raise SandboxError(f"cannot reach the sandbox runner: {exc}") from exc
        try:
            message = await future
        except asyncio.CancelledError:
            if op == "exec":  # nobody waits for the command any more: stop it, with what it started
                self._cancel(request_id)
            raise
        if not message.get("ok"):
            raise _error(message, fields.get("path"))
        return message

    def _cancel(self, request_id: int) -> None:
        """Ask the runner to kill the processes of exec request ``request_id`` (fire and forget)."""
        if self._lost:
            return
        try:
            self._write(
                json.dumps({"id": next(self._ids), "op": "cancel", "target": request_id}).encode() + b"\n"
            )
        except OSError:
            pass  # the runner is gone, and its commands with it

    # --- typed operations -----------------------------------------------------------------------
    async def exec(
        self, command: str, *, timeout: float | None, env: dict[str, str] | None, cwd: str | None
    ) -> ExecResult:
        r = await self.request("exec", command=command, timeout=timeout, env=env or {}, cwd=cwd)
        return ExecResult(
            exit_code=r["exit_code"],
            output=r["output"],
            timed_out=r["timed_out"],
            duration_s=r["duration_s"],
            oom_killed=r["oom_killed"],
            killed_reason=r["killed_reason"],
            pid_limit_hit=r["pid_limit_hit"],
        )

    async def read_file(self, path: str) -> bytes:
        return base64.b64decode((await self.request("read", path=path))["data"])

    async def write_file(self, path: str, data: bytes) -> None:
        await self.request("write", path=path, data=base64.b64encode(data).decode())

    async def list_files(self, path: str, max_depth: int) -> list[FileEntry]:
        r = await self.request("list", path=path, max_depth=max_depth)
        return [FileEntry(**e) for e in r["entries"]]

    async def stat(self, path: str) -> FileEntry | None:
        entry = (await self.request("stat", path=path))["entry"]
        return None if entry is None else FileEntry(**entry)

    async def realpath(self, path: str) -> str:
        return (await self.request("realpath", path=path))["path"]


def _call_soon(loop: asyncio.AbstractEventLoop, *args: object) -> None:
    try:
        loop.call_soon_threadsafe(*args)  # type: ignore[arg-type]
    except RuntimeError:
        pass  # the waiting event loop is closed: nobody is left to tell


def _resolve(future: asyncio.Future, message: dict) -> None:
    if not future.done():
        future.set_result(message)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _error(message: dict, path: object) -> Exception:
    name = message.get("error", "Error")
    text = message.get("message", "")
    code = message.get("errno")
    cls = _ERRORS.get(name)
    if cls is not None or (name == "OSError" and code):
        code = code or errno_codes.EIO
        return (cls or OSError)(code, os.strerror(code), path)
    return SandboxError(f"sandbox runner error {name}: {text}")


class SessionSandbox(Sandbox):
    """A sandbox whose operations all go through one runner session (set ``_session`` in start)."""

    _session: RunnerSession | None = None
    #: The commit ``diff()`` compares against: the workspace as it was after the set-up commands.
    base_commit: str | None = None

    def _live_session(self) -> RunnerSession:
        if self._session is None:
            raise SandboxError(f"the {type(self).__name__} is not started (or already closed)")
        return self._session

    async def _run_setup_commands(self, commands: list[str], timeout: float) -> None:
        for command in commands:
            result = await self.exec(command, timeout=timeout)
            if result.exit_code != 0:
                status = result.killed_reason or f"exit {result.exit_code}"
                raise SandboxError(f"set-up command failed ({status}): {command}\n{result.output[-2000:]}")

    async def _record_baseline(self) -> None:
        result = await self.exec(BASELINE_SCRIPT)
        if result.exit_code != 0:
            raise SandboxError(f"could not record the workspace's starting commit:\n{result.output[-2000:]}")
        self.base_commit = result.output.strip().splitlines()[-1]

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        return await self._live_session().exec(command, timeout=timeout, env=env, cwd=cwd)

    async def read_file(self, path: str) -> bytes:
        return await self._live_session().read_file(path)

    async def write_file(self, path: str, data: bytes) -> None:
        await self._live_session().write_file(path, data)

    async def list_files(self, path: str, max_depth: int = 2) -> list[FileEntry]:
        return await self._live_session().list_files(path, max_depth)

    async def stat(self, path: str) -> FileEntry | None:
        return await self._live_session().stat(path)

    async def realpath(self, path: str) -> str:
        return await self._live_session().realpath(path)

    async def diff(self) -> str:
        if self.base_commit is None:
            raise SandboxError(f"the {type(self).__name__} is not started (or already closed)")
        result = await self.exec(diff_script(self.base_commit))
        if result.exit_code != 0:
            raise SandboxError(f"git diff failed in the workspace:\n{result.output[-2000:]}")
        return result.output
