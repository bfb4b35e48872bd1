"""Host side of the runner protocol: one long-lived session per sandbox.

:class:`SessionSandbox` implements the :class:`Sandbox` operations over a :class:`RunnerSession`;
the backends only create the runner (a host subprocess or a container) and connect its pipes.
:class:`RunnerSession` sends JSON-line requests to the runner (:mod:`clover_agent.sandboxes.runner`)
and matches responses by id; since the sandbox's side is untrusted it drops answers without the
right HMAC, refuses arguments that cannot cross (:class:`SandboxArgumentError`) and puts a timeout
on every operation (:data:`FILE_OP_TIMEOUT_S`, :data:`EXEC_GRACE_S`), so a lost answer is an error,
never a hang (sandboxes/README.md). It is the host half of one contract with the runner, kept in
one module so each operation's request sits beside its checks.
"""

from __future__ import annotations

import asyncio
import base64
import errno as errno_codes
import hashlib
import hmac
import itertools
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from clover_agent.sandboxes.arguments import check_fields
from clover_agent.sandboxes.base import (
    MAX_READ_BYTES,
    ExecResult,
    FileEntry,
    FileTooLargeError,
    LineRange,
    Listing,
    OutputSink,
    Put,
    Sandbox,
    SandboxArgumentError,
    SandboxError,
    SpecialFileError,
    TreeEntry,
)
from clover_agent.sandboxes.errors import WorkspaceDiffError
from clover_agent.sandboxes.workspace import BASELINE_SCRIPT, diff_script

#: The runner's source, sent as the first stdin line to :data:`BOOTSTRAP`.
RUNNER_SOURCE = (Path(__file__).parent / "runner.py").read_text()
#: ``python3 -I -c BOOTSTRAP WORKSPACE_ROOT MODE`` starts a runner from the source on its first
#: stdin line (MODE: "container" or "local", see the runner). ``-I`` (isolated): the interpreter
#: reads no ``PYTHON*`` variable and puts neither the working folder (the workspace) nor the user's
#: site folder on ``sys.path``, so a ``select.py`` or ``resource.py`` in the workspace is never
#: what the runner imports. The commands it runs still get the whole environment.
BOOTSTRAP = "import sys,json;exec(compile(json.loads(sys.stdin.readline()),'clover-runner','exec'))"


def runner_command(python: str, root: str, mode: str) -> list[str]:
    """The command line that starts a runner (see :data:`BOOTSTRAP`)."""
    return [python, "-I", "-u", "-c", BOOTSTRAP, root, mode]


log = logging.getLogger(__name__)

#: Seconds a file operation may take before it fails with ``TimeoutError``.
FILE_OP_TIMEOUT_S = 60.0
#: Seconds past a command's own timeout before the host stops waiting for its answer.
EXEC_GRACE_S = 60.0
#: Longer than any answer (the runner caps them at 112 Mi characters): the host's buffer limit.
MAX_LINE_BYTES = 128 * 1024 * 1024
#: How many bytes of a sparse file's data one ``write_at`` request carries.
WRITE_CHUNK_BYTES = 8 * 1024 * 1024
#: File bytes one ``read_many`` answer or ``put`` request carries at most.
READ_BATCH_BYTES = 32 * 1024 * 1024
#: Seconds a ``tree`` request may take (it hashes every file of the workspace when asked).
TREE_TIMEOUT_S = 600.0
#: Seconds ``stop_processes`` waits for the last process to go.
STOP_TIMEOUT_S = 10.0
#: The most characters of one streamed piece handed on (the runner sends at most 16 KiB of bytes).
MAX_PIECE_CHARS = 64 * 1024

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
        #: exec request id -> where its output goes as it comes (guarded by ``_pending_lock``)
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, OutputSink]] = {}
        self._buffer = bytearray()
        self._lost: str | None = None
        self._ready = threading.Event()
        self._key = secrets.token_bytes(32)
        self.dropped_lines = 0  # answer lines with a wrong MAC (forged or garbled)
        self.stderr_tail = bytearray()  # what the runner wrote to stderr, for error messages

    # --- transport side (reader thread) ---------------------------------------------------------
    def feed(self, data: bytes) -> None:
        scan_from = len(self._buffer)  # bytes before this were already searched for a newline
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n", scan_from)
            if end < 0:
                if len(self._buffer) > MAX_LINE_BYTES:  # no answer is this long: a flood
                    del self._buffer[:-MAX_LINE_BYTES]  # an answer would be at its end: keep that
                return
            line = self._buffer[:end]
            del self._buffer[: end + 1]
            scan_from = 0
            if line.strip():
                message = self._verify(line)
                if message is not None:
                    self._dispatch(message)

    def _verify(self, line: bytearray) -> dict | None:
        """The answer in ``line`` if its MAC is right; None (logged) for anything else, such as a
        line written into the runner's stream by a process in the sandbox. Bytes written ahead of
        an answer (with no line break of their own) are cut off: the answer is at the line's end."""
        message = self._checked(line)
        if message is not None:
            return message
        self._note_dropped()
        end = len(line)
        for _ in range(64):  # candidates from the end, each ``MAC {"id":...``; only a real one verifies
            end = line.rfind(b' {"id":', 0, end)
            if end < 64:
                return None
            message = self._checked(line[end - 64 :])
            if message is not None:
                return message
        return None

    def _checked(self, line: bytearray) -> dict | None:
        sep = line.find(b" ")
        if sep < 0:
            return None
        expected = hmac.new(self._key, memoryview(line)[sep + 1 :], hashlib.sha256).hexdigest()
        if not hmac.compare_digest(bytes(line[:sep]), expected.encode("ascii")):
            return None
        try:
            message = json.loads(line[sep + 1 :])
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    def _note_dropped(self) -> None:
        self.dropped_lines += 1
        if self.dropped_lines == 1:  # once per session: a hostile command may send thousands
            log.warning("dropped a line in the sandbox runner's output that the runner did not send")

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
        if "chunk" in message:  # a piece of a streamed command's output, not its answer
            self._piece(message)
            return
        with self._pending_lock:
            # any id, or none: only an int of ours finds a waiter
            waiter = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if waiter is not None:
            loop, future = waiter
            _call_soon(loop, _resolve, future, message)

    def _piece(self, message: dict) -> None:
        with self._pending_lock:
            stream = self._streams.get(message.get("id"))  # type: ignore[arg-type]
        text, skipped = message.get("chunk"), message.get("skipped")
        if stream is None or not isinstance(text, str):
            return
        text = text[-MAX_PIECE_CHARS:]
        if isinstance(skipped, int) and skipped > 0:
            text = f"[... {skipped} bytes not shown as they came ...]\n{text}"
        loop, sink = stream
        _call_soon(loop, sink, text)

    # --- caller side ----------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        """Send the runner's source and wait (blocking) for its ready line."""
        self._write(json.dumps(RUNNER_SOURCE).encode() + b"\n" + self._key.hex().encode() + b"\n")
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

    async def request(
        self,
        op: str,
        *,
        timeout: float | None = FILE_OP_TIMEOUT_S,
        on_output: OutputSink | None = None,
        **fields: object,
    ) -> dict:
        """Send one request and wait for its answer (at most ``timeout`` seconds, None = no limit);
        ``on_output`` (an exec): called on this event loop with each piece of output as it comes,
        all of them before the answer."""
        if self._lost:
            raise SandboxError(self._lost)
        check_fields(fields)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        request_id = next(self._ids)
        if on_output is not None:
            fields["stream"] = True
        with self._pending_lock:
            self._pending[request_id] = (loop, future)
            if on_output is not None:
                self._streams[request_id] = (loop, on_output)
        try:
            self._write(json.dumps({"id": request_id, "op": op, **fields}).encode() + b"\n")
        except OSError as exc:
            with self._pending_lock:
                self._pending.pop(request_id, None)
                self._streams.pop(request_id, None)
            raise SandboxError(f"cannot reach the sandbox runner: {exc}") from exc
        # Not asyncio.wait_for: up to Python 3.11 it can swallow a cancellation (Ctrl-C) that
        # arrives as the answer does; awaiting the future itself keeps the cancellation.
        timer = None if timeout is None else loop.call_later(timeout, _fail, future, _TimedOut())
        try:
            message = await future
        except _TimedOut:
            with self._pending_lock:
                self._pending.pop(request_id, None)
            what = f"the sandbox did not answer a `{op}` request within {timeout:g} s"
            if op == "exec":  # the runner enforces the command's timeout: its answer was lost
                raise SandboxError(what) from None
            raise TimeoutError(errno_codes.ETIMEDOUT, what, fields.get("path")) from None
        except asyncio.CancelledError:
            if op == "exec":  # nobody waits for the command any more: stop it, with what it started
                self._cancel(request_id)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if on_output is not None:
                with self._pending_lock:
                    self._streams.pop(request_id, None)
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
        self,
        command: str,
        *,
        timeout: float | None,
        env: dict[str, str] | None,
        cwd: str | None,
        on_output: OutputSink | None = None,
    ) -> ExecResult:
        wait = None if timeout is None else timeout + EXEC_GRACE_S
        r = await self.request(
            "exec",
            timeout=wait,
            on_output=on_output,
            command=command,
            timeout_s=timeout,
            env=env or {},
            cwd=cwd,
        )
        return ExecResult(
            exit_code=r["exit_code"],
            output=r["output"],
            timed_out=r["timed_out"],
            duration_s=r["duration_s"],
            oom_killed=r["oom_killed"],
            killed_reason=r["killed_reason"],
            pid_limit_hit=r["pid_limit_hit"],
            disk_full=r.get("disk_full"),
        )

    async def read_file(self, path: str, max_bytes: int = MAX_READ_BYTES) -> bytes:
        return base64.b64decode((await self.request("read", path=path, max_bytes=max_bytes))["data"])

    async def read_lines(self, path: str, first: int, last: int, max_bytes: int) -> LineRange:
        r = await self.request("read_lines", path=path, first=first, last=last, max_bytes=max_bytes)
        return LineRange(
            data=base64.b64decode(r["data"]),
            first=r["first"],
            last=r["last"],
            total_lines=r["total_lines"],
            size=r["size"],
            binary=r["binary"],
            truncated=r["truncated"],
        )

    async def write_file(self, path: str, data: bytes) -> None:
        await self.request("write", path=path, data=base64.b64encode(data).decode())

    async def write_at(self, path: str, offset: int, data: bytes, *, size: int | None, mode: int) -> None:
        await self.request(
            "write_at", path=path, offset=offset, data=base64.b64encode(data).decode(), size=size, mode=mode
        )

    async def list_files(
        self, path: str, max_depth: int, *, max_entries: int | None = None, skip_hidden: bool = False
    ) -> Listing:
        r = await self.request(
            "list", path=path, max_depth=max_depth, max_entries=max_entries, skip_hidden=skip_hidden
        )
        return Listing([FileEntry(**e) for e in r["entries"]], r["total"], r["complete"])

    async def stat(self, path: str) -> FileEntry | None:
        entry = (await self.request("stat", path=path))["entry"]
        return None if entry is None else FileEntry(**entry)

    async def realpath(self, path: str) -> str:
        return (await self.request("realpath", path=path))["path"]

    async def stop_all(self, timeout: float) -> tuple[int, list[int]]:
        r = await self.request("stop_all", timeout=timeout + FILE_OP_TIMEOUT_S, timeout_s=timeout)
        return r["killed"], r["left"]

    async def tree(self, *, prune: list[str], dirs_only: bool, hashes: bool) -> list[TreeEntry]:
        r = await self.request("tree", timeout=TREE_TIMEOUT_S, prune=prune, dirs_only=dirs_only, hash=hashes)
        if not r["complete"]:
            raise SandboxError(
                f"the workspace holds more than {len(r['entries']):,} entries: too many to take stock of"
            )
        return [TreeEntry(*e) for e in r["entries"]]

    async def fingerprint(self) -> str | None:
        return (await self.request("fingerprint", timeout=TREE_TIMEOUT_S))["digest"]

    async def copy_file(self, src: str, dst: str, *, mtime_ns: int) -> bool:
        return (await self.request("copy", src=src, dst=dst, mtime_ns=mtime_ns))["copied"]

    async def read_files(self, paths: list[str]) -> dict[str, bytes | str]:
        found: dict[str, bytes | str] = {}
        rest = list(paths)
        while rest:
            r = await self.request("read_many", paths=rest, max_bytes=READ_BATCH_BYTES)
            for path, data, error in r["files"]:
                found[path] = base64.b64decode(data) if data is not None else str(error)
            rest = rest[len(r["files"]) :]
        return found

    async def put(self, entries: list[Put]) -> None:
        batch: list[list[object]] = []
        size = 0
        for e in entries:
            if e.kind == "file":
                item: list[object] = [e.path, "file", e.mode, base64.b64encode(e.data).decode()]
            elif e.kind == "link":
                item = [e.path, "link", 0, e.target]
            else:
                item = [e.path, "absent"]
            batch.append(item)
            size += len(e.data)
            if size >= READ_BATCH_BYTES:
                await self.request("put", entries=batch)
                batch, size = [], 0
        if batch:
            await self.request("put", entries=batch)


class _TimedOut(Exception):
    """A request's answer did not come in time (set on its future by a timer)."""


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
    """The exception for a refused request. Only a lost runner is a :class:`SandboxError`: an
    operation that failed while the runner lives is an ``OSError`` or a bad argument."""
    name = message.get("error", "Error")
    text = message.get("message", "")
    code = message.get("errno")
    if name == "InvalidArgument":
        return SandboxArgumentError(f"the sandbox refused the request: {text}")
    if name == "SpecialFileError":
        return SpecialFileError(str(message.get("kind", "special file")), path)
    if name == "FileTooLargeError":
        return FileTooLargeError(int(message.get("size", 0)), int(message.get("limit", 0)), path)
    cls = _ERRORS.get(name)
    if cls is not None or code:
        code = code or errno_codes.EIO
        return (cls or OSError)(code, os.strerror(code), path)
    return OSError(errno_codes.EIO, f"the sandbox runner failed: {name}: {text}", path)


class SessionSandbox(Sandbox):
    """A sandbox whose operations all go through one runner session (set ``_session`` in start)."""

    _session: RunnerSession | None = None

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

    async def _record_baseline(self, keep_out: list[str]) -> None:
        """Commit the starting state; ``keep_out``: gitignore patterns of files git must not read
        (the untracked sparse files, see :mod:`~clover_agent.sandboxes.workspace`)."""
        env = {"CLOVER_KEEP_OUT": "\n".join(keep_out)} if keep_out else None
        result = await self.exec(BASELINE_SCRIPT, env=env)
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
        on_output: OutputSink | None = None,
    ) -> ExecResult:
        return await self._live_session().exec(
            command, timeout=timeout, env=env, cwd=cwd, on_output=on_output
        )

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        return await self._live_session().read_file(path, max_bytes)

    async def read_lines(self, path: str, first: int, last: int, *, max_bytes: int) -> LineRange:
        return await self._live_session().read_lines(path, first, last, max_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        await self._live_session().write_file(path, data)

    async def list_files(self, path: str, max_depth: int = 2) -> list[FileEntry]:
        return (await self._live_session().list_files(path, max_depth)).entries

    async def list_entries(
        self, path: str, max_depth: int, *, max_entries: int, skip_hidden: bool = False
    ) -> Listing:
        return await self._live_session().list_files(
            path, max_depth, max_entries=max_entries, skip_hidden=skip_hidden
        )

    async def stat(self, path: str) -> FileEntry | None:
        return await self._live_session().stat(path)

    async def realpath(self, path: str) -> str:
        return await self._live_session().realpath(path)

    async def stop_processes(self) -> int:
        killed, left = await self._live_session().stop_all(STOP_TIMEOUT_S)
        if left:
            raise SandboxError(
                f"{len(left)} process(es) in the sandbox survived being killed for {STOP_TIMEOUT_S:g} s "
                f"(pids {', '.join(map(str, left[:10]))})"
            )
        return killed

    async def tree(
        self, *, prune: list[str] | None = None, dirs_only: bool = False, hashes: bool = False
    ) -> list[TreeEntry]:
        return await self._live_session().tree(prune=prune or [], dirs_only=dirs_only, hashes=hashes)

    async def read_files(self, paths: list[str]) -> dict[str, bytes | str]:
        return await self._live_session().read_files(paths)

    async def fingerprint(self) -> str | None:
        return await self._live_session().fingerprint()

    async def copy_file(self, src: str, dst: str, *, mtime_ns: int) -> bool:
        return await self._live_session().copy_file(src, dst, mtime_ns=mtime_ns)

    async def put(self, entries: list[Put]) -> None:
        await self._live_session().put(entries)

    async def diff(self) -> str:
        if self.base_commit is None:
            raise SandboxError(f"the {type(self).__name__} is not started (or already closed)")
        result = await self.exec(diff_script(self.base_commit))
        if result.exit_code != 0:
            why = result.killed_reason or result.disk_full or f"exit {result.exit_code}"
            raise WorkspaceDiffError(f"git diff failed in the workspace ({why}):\n{result.output[-2000:]}")
        return result.output
