"""The process that lives inside a sandbox and runs every request the host sends it.

One long-lived runner per sandbox answers JSON-line requests on stdin with JSON-line responses on
stdout, so a command costs a process spawn, not a ``docker exec`` (tens of milliseconds). It is
standard-library only and never imports clover-agent: the host sends this file's source as the
first line of stdin to ``python3 -c BOOTSTRAP`` (see :mod:`clover_agent.sandboxes.session`), so any
image with a Python 3 interpreter works and the code always matches the host's version.

Protocol: request ``{"id": N, "op": OP, ...}``; response ``{"id": N, "ok": true, ...}`` or
``{"id": N, "ok": false, "error": EXCEPTION_NAME, "errno": E, "message": TEXT}``. Ops: ``exec``,
``read``, ``write``, ``list``, ``stat``, ``realpath``, and ``cancel`` (``"target": N``: kill the
processes of the ``exec`` request N, whose caller stopped waiting). File data travels base64-encoded.

Paths in requests are sandbox paths: ``/workspace/...`` maps to the runner's workspace root
(``sys.argv[1]``; the identity inside a container, the private copy for the local sandbox); other
absolute paths are used as they are; relative paths are relative to ``/workspace``.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

WORKSPACE = "/workspace"
ROOT = sys.argv[1] if len(sys.argv) > 1 else WORKSPACE
DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024
#: After the command's main process ends, how long to keep reading output from processes that left
#: its process group and still hold the pipe.
DRAIN_GRACE_S = 1.0

#: Read once at start (``os.umask`` can only be read by setting it, which is not thread-safe).
_UMASK = os.umask(0o022)
os.umask(_UMASK)

_write_lock = threading.Lock()
_running_groups: set[int] = set()
_groups_lock = threading.Lock()
_group_of_request: dict[object, int] = {}  # exec request id -> its process group
_cancelled: set[object] = set()  # exec request ids cancelled (maybe before they started)


def host_path(path: str) -> str:
    if not path.startswith("/"):
        path = WORKSPACE + "/" + path
    path = posixpath.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return ROOT + path[len(WORKSPACE) :]
    return path


def sandbox_path(real: str) -> str:
    if real == ROOT or real.startswith(ROOT.rstrip("/") + "/"):
        return WORKSPACE + real[len(ROOT) :]
    return real


def _cgroup_files() -> tuple[str | None, str | None]:
    """Files whose counters say how often this cgroup hit its memory and pid limits."""
    paths = {"": "/"}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    paths[c] = path
    except OSError:
        pass
    v2 = paths.get("", "/")
    memory = [
        f"/sys/fs/cgroup{v2}/memory.events",
        "/sys/fs/cgroup/memory.events",
        f"/sys/fs/cgroup/memory{paths.get('memory', '/')}/memory.oom_control",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    pids = [
        f"/sys/fs/cgroup{v2}/pids.events",
        "/sys/fs/cgroup/pids.events",
        f"/sys/fs/cgroup/pids{paths.get('pids', '/')}/pids.events",
        "/sys/fs/cgroup/pids/pids.events",
    ]
    first = lambda cands: next((p for p in cands if os.path.isfile(p)), None)  # noqa: E731
    return first(memory), first(pids)


MEMORY_EVENTS, PIDS_EVENTS = _cgroup_files()


def _counter(path: str | None, key: str) -> int:
    if path is None:
        return 0
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


class Capture:
    """Keeps the first and last ``limit / 2`` bytes of a stream and counts what was dropped."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            extra = len(self.tail) - self.half
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def text(self) -> str:
        middle = b"\n[... %d bytes of output omitted ...]\n" % self.dropped if self.dropped else b""
        return (bytes(self.head) + middle + bytes(self.tail)).decode("utf-8", "replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def op_exec(req: dict) -> dict:
    env = dict(os.environ)
    env.update(req.get("env") or {})
    timeout = req.get("timeout")
    capture = Capture(int(req.get("max_output") or DEFAULT_MAX_OUTPUT))
    oom_before = _counter(MEMORY_EVENTS, "oom_kill")
    pids_before = _counter(PIDS_EVENTS, "max")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", "-c", req["command"]],
            cwd=host_path(req.get("cwd") or WORKSPACE),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except BlockingIOError as exc:  # EAGAIN from fork: every process slot is taken
        return {
            "exit_code": None,
            "output": f"could not start the command: {exc.strerror}",
            "timed_out": False,
            "duration_s": time.monotonic() - start,
            "oom_killed": False,
            "pid_limit_hit": True,
            "killed_reason": "process limit reached: the command could not start",
        }
    pgid = proc.pid
    with _groups_lock:
        _running_groups.add(pgid)
        _group_of_request[req.get("id")] = pgid
        cancelled = req.get("id") in _cancelled
    if cancelled:
        _kill_group(pgid)
    try:
        # Make the command, not the runner, the first choice of the out-of-memory killer.
        with open(f"/proc/{proc.pid}/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass
    out_fd = proc.stdout.fileno()
    os.set_blocking(out_fd, False)
    try:
        exit_fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        exit_fd = None  # no pidfd (old kernel, not Linux): poll the process every 50 ms
    poller = select.poll()
    poller.register(out_fd, select.POLLIN)
    if exit_fd is not None:
        poller.register(exit_fd, select.POLLIN)
    deadline = start + timeout if timeout else None
    out_open, exited, timed_out = True, False, False

    def read_available() -> None:
        nonlocal out_open
        while True:
            try:
                chunk = os.read(out_fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                out_open = False
                poller.unregister(out_fd)
                return
            capture.add(chunk)

    while not exited:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            timed_out = True
            break
        wait = 50 if exit_fd is None else -1
        if deadline is not None:
            left = int((deadline - now) * 1000) + 1
            wait = left if wait < 0 else min(wait, left)
        for fd, _ in poller.poll(wait):
            if fd == out_fd:
                read_available()
            elif fd == exit_fd:
                exited = True
        if exit_fd is None and proc.poll() is not None:
            exited = True
    # The command is over (or out of time): nothing it started may outlive it. Kill the group
    # again while draining, in case a member was mid-fork (a fork storm) when the first kill came.
    _kill_group(pgid)
    grace_end = time.monotonic() + DRAIN_GRACE_S
    while out_open:
        left = grace_end - time.monotonic()
        if left <= 0:
            break
        if poller.poll(min(int(left * 1000) + 1, 20)):
            read_available()
        else:
            _kill_group(pgid)
    proc.stdout.close()
    if exit_fd is not None:
        os.close(exit_fd)
    returncode = proc.wait()
    with _groups_lock:
        _running_groups.discard(pgid)
        _group_of_request.pop(req.get("id"), None)
        cancelled = req.get("id") in _cancelled
        _cancelled.discard(req.get("id"))
    duration = time.monotonic() - start
    oom = returncode == -signal.SIGKILL and _counter(MEMORY_EVENTS, "oom_kill") > oom_before
    pid_limit = _counter(PIDS_EVENTS, "max") > pids_before
    reason = None
    if timed_out:
        reason = f"timeout after {timeout:g} s"
    elif cancelled:
        reason = "cancelled: the caller stopped waiting"
    elif oom:
        reason = "out of memory: killed at the sandbox's memory limit"
    elif returncode < 0:
        reason = f"killed by signal {signal.Signals(-returncode).name}"
    if pid_limit:
        note = "process limit reached: some forks failed"
        reason = f"{reason}; {note}" if reason else note
    return {
        "exit_code": None if timed_out else (128 - returncode if returncode < 0 else returncode),
        "output": capture.text(),
        "timed_out": timed_out,
        "duration_s": duration,
        "oom_killed": oom,
        "pid_limit_hit": pid_limit,
        "killed_reason": reason,
    }


def _entry(path: str, real: str) -> dict:
    st = os.lstat(real)
    is_link = stat.S_ISLNK(st.st_mode)
    is_dir = os.path.isdir(real)
    return {"path": path, "is_dir": is_dir, "size": 0 if is_dir else st.st_size, "is_symlink": is_link}


def op_list(req: dict) -> dict:
    """Entries below ``path`` up to ``max_depth`` levels, sorted; ``.git`` and symlinked folders are
    listed but not entered."""
    top = host_path(req["path"])
    if not os.path.isdir(top):
        os.listdir(top)  # raises the right error: FileNotFoundError / NotADirectoryError
    max_depth = int(req.get("max_depth", 2))
    entries = []

    def walk(real: str, depth: int) -> None:
        for name in sorted(os.listdir(real)):
            child = os.path.join(real, name)
            try:
                e = _entry(sandbox_path(child), child)
            except OSError:
                continue
            entries.append(e)
            if e["is_dir"] and not e["is_symlink"] and name != ".git" and depth < max_depth:
                try:
                    walk(child, depth + 1)
                except OSError:
                    pass

    walk(top, 1)
    return {"entries": entries}


def op_read(req: dict) -> dict:
    with open(host_path(req["path"]), "rb") as f:
        return {"data": base64.b64encode(f.read()).decode()}


def op_write(req: dict) -> dict:
    """Replace the file atomically (a temporary file renamed over it), so a failed write (a full
    disk, bad data) leaves the old content whole. A symlink is written through to its target; an
    existing file keeps its mode, a new one gets the usual ``0o666 & ~umask``."""
    data = base64.b64decode(req["data"])
    real = os.path.realpath(host_path(req["path"]))
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".clover-write-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {}


def op_stat(req: dict) -> dict:
    real = host_path(req["path"])
    try:
        return {"entry": _entry(sandbox_path(real), real)}
    except FileNotFoundError:
        return {"entry": None}


def op_realpath(req: dict) -> dict:
    return {"path": sandbox_path(os.path.realpath(host_path(req["path"])))}


def op_cancel(req: dict) -> dict:
    with _groups_lock:
        _cancelled.add(req["target"])
        pgid = _group_of_request.get(req["target"])
    if pgid is not None:
        _kill_group(pgid)
    return {}


OPS = {
    "exec": op_exec,
    "cancel": op_cancel,
    "read": op_read,
    "write": op_write,
    "list": op_list,
    "stat": op_stat,
    "realpath": op_realpath,
}


def respond(message: dict) -> None:
    line = json.dumps(message, separators=(",", ":")) + "\n"
    with _write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def handle(req: dict) -> None:
    try:
        result = OPS[req["op"]](req)
        result.update(id=req["id"], ok=True)
        respond(result)
    except Exception as exc:
        respond(
            {
                "id": req.get("id"),
                "ok": False,
                "error": type(exc).__name__,
                "errno": getattr(exc, "errno", None),
                "message": str(exc),
            }
        )


def main() -> None:
    respond({"id": 0, "ok": True, "ready": True, "pid": os.getpid(), "root": ROOT})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "exec":
            try:
                threading.Thread(target=handle, args=(req,), daemon=True).start()
                continue
            except RuntimeError:  # no thread left under the pid limit: run it here
                pass
        handle(req)
    # The host went away (closed or killed): nothing started here may outlive it.
    with _groups_lock:
        for pgid in list(_running_groups):
            _kill_group(pgid)


if __name__ == "__main__":
    main()
