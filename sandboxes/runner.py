"""The process that lives inside a sandbox and runs every request the host sends it.

One long-lived runner per sandbox answers JSON-line requests on stdin with JSON-line responses on
stdout, each authenticated by an HMAC, so a command costs a process spawn, not a ``docker exec``.
It is standard-library only and never imports clover-agent: the host sends this file's source at
start (see :mod:`clover_agent.sandboxes.session`), so any image with a Python 3 interpreter works
and the code always matches the host's version; that is also why it is one module. The protocol,
its operations and what the runner does against hostile commands beside it (non-dumpable, no
FIFO or device ever opened, sizes checked before content moves, bad arguments answered, never a
crash) are in sandboxes/README.md ("How it works").
"""

from __future__ import annotations

import base64
import codecs
import errno
import hashlib
import hmac
import json
import os
import posixpath
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

WORKSPACE = "/workspace"
ROOT = sys.argv[1] if len(sys.argv) > 1 else WORKSPACE
#: "container": the runner is alone in its process namespace (beside the container's init), so
#: ``stop_all`` signals every process it may; "local": it shares the machine, so it becomes the
#: reaper of what its commands start (``PR_SET_CHILD_SUBREAPER``: a double-forked or ``setsid``
#: daemon stays its descendant) and ``stop_all`` kills its descendants only.
MODE = sys.argv[2] if len(sys.argv) > 2 else "container"
DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024
#: After the command's main process ends, how long to keep reading output from processes that left
#: its process group and still hold the pipe.
DRAIN_GRACE_S = 1.0
#: A streamed command (``stream`` set) sends what it printed at most this often, and at most
#: :data:`STREAM_PIECE_BYTES` of it each time (the newest; what is skipped is counted): the host
#: shows it as it comes, and the whole output still comes in the answer.
STREAM_INTERVAL_S = 0.1
STREAM_PIECE_BYTES = 16 * 1024
#: The most one ``read`` returns; the host's ``MAX_READ_BYTES`` (this file imports nothing of ours).
MAX_READ_BYTES = 64 * 1024 * 1024
#: ``list`` returns at most this many entries; it stops counting after :data:`MAX_WALK_ENTRIES`.
MAX_LIST_ENTRIES = 100_000
MAX_WALK_ENTRIES = 1_000_000
#: ``read_lines`` stops counting a file's lines after this many bytes or seconds.
MAX_SCAN_BYTES = 1 << 30
MAX_SCAN_S = 20.0
#: A response longer than this is replaced by an error (the largest real ones: a 64 MiB read,
#: 86 MiB in base64; 16 MiB of output that is not UTF-8, at most 96 MiB escaped).
MAX_RESPONSE_CHARS = 112 * 1024 * 1024
SNIFF_BYTES = 8192
#: What tools print when a write fails for lack of space (checked in a command's output).
NO_SPACE_MESSAGES = (
    b"No space left on device",
    b"Disk quota exceeded",
    b"File too large",
    b"File size limit exceeded",
)
SPECIAL_KINDS = (
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)

#: Read once at start (``os.umask`` can only be read by setting it, which is not thread-safe).
_UMASK = os.umask(0o022)
os.umask(_UMASK)

_write_lock = threading.Lock()
_key = b""  # the MAC key, read from stdin in main()
_running_groups: set[int] = set()
_groups_lock = threading.Lock()
_group_of_request: dict[object, int] = {}  # exec request id -> its process group
_cancelled: set[object] = set()  # exec request ids cancelled (maybe before they started)
#: Held while a command is started and registered, and while orphans are reaped (local mode), so a
#: command's own exit status is never taken by the reaper.
_spawn_lock = threading.Lock()


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


class Refused(Exception):
    """A request refused with a named error and extra fields for the host (``size``, ``kind``)."""

    def __init__(self, name: str, message: str, **fields: object) -> None:
        super().__init__(message)
        self.name = name
        self.fields = fields


def special_kind(mode: int) -> str | None:
    """ "FIFO (named pipe)", "socket", ... for a special file's mode; None for files and folders."""
    return next((kind for test, kind in SPECIAL_KINDS if test(mode)), None)


def _refuse_special(st: os.stat_result, path: str) -> None:
    kind = special_kind(st.st_mode)
    if kind is not None:
        raise Refused("SpecialFileError", f"{sandbox_path(path)} is a {kind}", kind=kind, errno=errno.EINVAL)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """Open a regular file for reading, or refuse: the target is stat'ed first (a symlink to a FIFO
    counts), and opened non-blocking and checked again, so a FIFO swapped in between cannot block."""
    _refuse_special(os.stat(path), path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        _refuse_special(st, path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _too_large(size: int, limit: int) -> Refused:
    return Refused(
        "FileTooLargeError", f"the file is {size} bytes, over the {limit}-byte limit", size=size, limit=limit
    )


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def space_note(said_no_space: bool) -> str | None:
    """Usage of the workspace and temporary file systems, in words, when one is (nearly) full or a
    command said it ran out of space; None otherwise."""
    parts, full = [], False
    for label, path in (("/workspace", ROOT), ("/tmp", tempfile.gettempdir())):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        if total <= 0:
            continue
        nearly = free < max(1 << 20, min(total // 100, 64 << 20))
        full = full or nearly
        parts.append(
            f"{label} {'is full: ' if nearly else 'has '}{_size_text(total - free)} of "
            f"{_size_text(total)} used"
        )
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if cap != resource.RLIM_INFINITY:
            parts.append(f"each file may be at most {_size_text(cap)}")
    except (ImportError, OSError):
        pass
    if not (full or said_no_space) or not parts:
        return None
    return "; ".join(parts)


def _make_undumpable() -> bool:
    """Close this process's /proc entries (fds, memory) to the commands, which run as the same
    user; what they exec is dumpable again, so commands are unaffected."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except (ImportError, OSError, AttributeError):
        return False


def _make_subreaper() -> bool:
    """Become the reaper of orphaned descendants (``PR_SET_CHILD_SUBREAPER``), so a daemon a
    command starts (``setsid``, a double fork) stays below this runner, where ``stop_all`` finds it."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


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

    def says(self, needles: tuple[bytes, ...]) -> bool:
        return any(n in self.head or n in self.tail for n in needles)

    def text(self) -> str:
        middle = b"\n[... %d bytes of output omitted ...]\n" % self.dropped if self.dropped else b""
        return (bytes(self.head) + middle + bytes(self.tail)).decode("utf-8", "replace")


class Stream:
    """Sends a streamed command's output to the host in pieces while it runs: ``{"id", "chunk",
    "skipped"}`` lines (no ``ok``: not the answer), decoded as UTF-8 across piece boundaries."""

    def __init__(self, request_id: object) -> None:
        self.id = request_id
        self.pending = bytearray()
        self.skipped = 0
        self.due = 0.0  # when the next piece may go
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, data: bytes) -> None:
        self.pending += data
        extra = len(self.pending) - STREAM_PIECE_BYTES
        if extra > 0:
            del self.pending[:extra]
            self.skipped += extra

    def wait_ms(self, now: float) -> int | None:
        """Milliseconds until the pending bytes may go; None with nothing pending."""
        return None if not self.pending else max(int((self.due - now) * 1000) + 1, 0)

    def flush(self, now: float, *, final: bool = False) -> None:
        if not final and (not self.pending or now < self.due):
            return
        if self.skipped:  # the bytes before these are gone: no sequence carries over
            self.decoder.reset()
        text = self.decoder.decode(bytes(self.pending), final=final)
        if text or self.skipped:
            respond({"id": self.id, "chunk": text, "skipped": self.skipped})
        self.pending.clear()
        self.skipped = 0
        self.due = now + STREAM_INTERVAL_S


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def op_exec(req: dict) -> dict:
    env = dict(os.environ)
    env.update(req.get("env") or {})
    timeout = req.get("timeout_s")
    capture = Capture(int(req.get("max_output") or DEFAULT_MAX_OUTPUT))
    stream = Stream(req.get("id")) if req.get("stream") is True else None
    oom_before = _counter(MEMORY_EVENTS, "oom_kill")
    pids_before = _counter(PIDS_EVENTS, "max")
    start = time.monotonic()
    try:
        with _spawn_lock:
            proc = subprocess.Popen(
                ["bash", "-c", req["command"]],
                cwd=host_path(req.get("cwd") or WORKSPACE),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with _groups_lock:
                _running_groups.add(proc.pid)
    except BlockingIOError as exc:  # EAGAIN from fork: every process slot is taken
        return {
            "exit_code": None,
            "output": f"could not start the command: {exc.strerror}",
            "timed_out": False,
            "duration_s": time.monotonic() - start,
            "oom_killed": False,
            "pid_limit_hit": True,
            "killed_reason": "process limit reached: the command could not start",
            "disk_full": None,
        }
    pgid = proc.pid
    with _groups_lock:
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
    assert proc.stdout is not None  # stdout=PIPE
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
            if stream is not None:
                stream.add(chunk)

    while not exited:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            timed_out = True
            break
        wait = 50 if exit_fd is None else -1
        if deadline is not None:
            left = int((deadline - now) * 1000) + 1
            wait = left if wait < 0 else min(wait, left)
        piece = None if stream is None else stream.wait_ms(now)
        if piece is not None:
            wait = piece if wait < 0 else min(wait, piece)
        for fd, _ in poller.poll(wait):
            if fd == out_fd:
                read_available()
            elif fd == exit_fd:
                exited = True
        if stream is not None:
            stream.flush(time.monotonic())
        if exit_fd is None and proc.poll() is not None:
            exited = True
    # The command is over (or out of time): nothing it started may outlive it. Kill the group
    # again while draining, in case a member was mid-fork (a fork storm) when the first kill came.
    _kill_group(pgid)
    grace_end = time.monotonic() + DRAIN_GRACE_S
    while out_open:
        grace_left = grace_end - time.monotonic()
        if grace_left <= 0:
            break
        if poller.poll(min(int(grace_left * 1000) + 1, 20)):
            read_available()
        else:
            _kill_group(pgid)
    proc.stdout.close()
    if exit_fd is not None:
        os.close(exit_fd)
    if stream is not None:  # the rest, before the answer (the host shows pieces until it comes)
        stream.flush(time.monotonic(), final=True)
    returncode = proc.wait()
    with _groups_lock:
        _running_groups.discard(pgid)
        _group_of_request.pop(req.get("id"), None)
        cancelled = req.get("id") in _cancelled
        _cancelled.discard(req.get("id"))
    if MODE == "local":
        _reap_orphans()
    duration = time.monotonic() - start
    # The main process, or any process it started (``git`` under a shell), killed out of memory.
    oom = _counter(MEMORY_EVENTS, "oom_kill") > oom_before
    pid_limit = _counter(PIDS_EVENTS, "max") > pids_before
    reason = None
    if timed_out:
        reason = f"timeout after {timeout:g} s"
    elif cancelled:
        reason = "cancelled: the caller stopped waiting"
    elif oom and returncode == -signal.SIGKILL:
        reason = "out of memory: killed at the sandbox's memory limit"
    elif oom:
        reason = "out of memory: a process it started was killed at the sandbox's memory limit"
    elif returncode == -signal.SIGXFSZ:
        reason = "killed by signal SIGXFSZ: a file grew past the sandbox's file size limit"
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
        "disk_full": space_note(capture.says(NO_SPACE_MESSAGES)),
    }


def _entry(path: str, real: str) -> dict:
    """``is_symlink`` is about ``real`` itself; ``is_dir``, ``size`` and ``special`` follow a link."""
    st = os.lstat(real)
    is_link = stat.S_ISLNK(st.st_mode)
    if is_link:
        try:
            st = os.stat(real)
        except OSError:  # a broken link (or a loop): it stands for nothing
            return {"path": path, "is_dir": False, "size": 0, "is_symlink": True, "special": None}
    is_dir = stat.S_ISDIR(st.st_mode)
    return {
        "path": path,
        "is_dir": is_dir,
        "size": 0 if is_dir else st.st_size,
        "is_symlink": is_link,
        "special": special_kind(st.st_mode),
    }


def op_list(req: dict) -> dict:
    """Entries below ``path`` up to ``max_depth`` levels, sorted, at most ``max_entries`` of them
    (``total`` counts all, ``complete`` says whether the walk finished). ``.git`` and symlinked
    folders are listed but not entered; with ``skip_hidden``, names starting with ``.`` are neither."""
    top = host_path(req["path"])
    if not os.path.isdir(top):
        os.listdir(top)  # raises the right error: FileNotFoundError / NotADirectoryError
    max_depth = int(req.get("max_depth", 2))
    limit = min(int(req.get("max_entries") or MAX_LIST_ENTRIES), MAX_LIST_ENTRIES)
    skip_hidden = bool(req.get("skip_hidden"))
    entries: list[dict] = []
    total = 0

    def walk(real: str, depth: int) -> bool:
        nonlocal total
        for name in sorted(os.listdir(real)):
            if skip_hidden and name.startswith("."):
                continue
            if total >= MAX_WALK_ENTRIES:
                return False
            child = os.path.join(real, name)
            try:
                e = _entry(sandbox_path(child), child)
            except OSError:
                continue
            total += 1
            if len(entries) < limit:
                entries.append(e)
            if e["is_dir"] and not e["is_symlink"] and name != ".git" and depth < max_depth:
                try:
                    if not walk(child, depth + 1):
                        return False
                except OSError:
                    pass
        return True

    complete = walk(top, 1)
    return {"entries": entries, "total": total, "complete": complete}


def op_read(req: dict) -> dict:
    """The whole file, refused before reading when over ``max_bytes`` (at most MAX_READ_BYTES)."""
    limit = min(int(req.get("max_bytes") or MAX_READ_BYTES), MAX_READ_BYTES)
    fd, st = open_regular(host_path(req["path"]))
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise _too_large(st.st_size, limit)
        data = f.read(limit + 1)  # files in /proc say 0 bytes; a file may grow while read
    if len(data) > limit:
        raise _too_large(max(st.st_size, len(data)), limit)
    return {"data": base64.b64encode(data).decode()}


def op_read_lines(req: dict) -> dict:
    """Lines ``first..last`` (1-based; ``last`` -1 = to the end; lines end at ``\\n``), at most
    ``max_bytes`` of them, and the file's line count (None past MAX_SCAN_BYTES / MAX_SCAN_S)."""
    first, last = max(1, int(req["first"])), int(req["last"])
    limit = min(int(req.get("max_bytes") or MAX_READ_BYTES), MAX_READ_BYTES)
    fd, st = open_regular(host_path(req["path"]))
    out = bytearray()
    line, newlines, scanned = 1, 0, 0  # ``line``: the line the next byte belongs to
    truncated, binary, ends_open, counted = False, False, False, True
    deadline = time.monotonic() + MAX_SCAN_S
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            if scanned == 0:
                binary = b"\0" in chunk[:SNIFF_BYTES]
            scanned += len(chunk)
            ends_open = not chunk.endswith(b"\n")
            pos = 0
            while pos < len(chunk):
                wanted = not truncated and line >= first and (last == -1 or line <= last)
                if not wanted:
                    if line < first:  # skip whole lines up to ``first`` at C speed
                        n = chunk.count(b"\n", pos)
                        if line + n < first:
                            line, newlines, pos = line + n, newlines + n, len(chunk)
                            break
                        while line < first:  # ``first`` starts in this chunk
                            pos = chunk.find(b"\n", pos) + 1
                            line, newlines = line + 1, newlines + 1
                        continue
                    else:  # past the range: only count
                        n = chunk.count(b"\n", pos)
                        line, newlines, pos = line + n, newlines + n, len(chunk)
                        break
                nl = chunk.find(b"\n", pos)
                end = len(chunk) if nl < 0 else nl + 1
                if wanted:
                    piece = chunk[pos:end]
                    room = limit - len(out)
                    if len(piece) > room:
                        out += piece[:room]
                        truncated = True
                    else:
                        out += piece
                pos = end
                if nl >= 0:
                    line += 1
                    newlines += 1
            if scanned >= MAX_SCAN_BYTES or time.monotonic() > deadline:
                counted = False  # what is read so far is all there is to send
                break
    total = newlines + (1 if scanned and ends_open else 0)
    got = out.count(b"\n") + (1 if out and not out.endswith(b"\n") else 0)
    return {
        "data": base64.b64encode(bytes(out)).decode(),
        "first": first,
        "last": first + got - 1,
        "total_lines": total if counted else None,
        "size": st.st_size,
        "binary": binary,
        "truncated": truncated,
    }


def op_write(req: dict) -> dict:
    """Replace the file atomically (a temporary file renamed over it), so a failed write (a full
    disk, bad data) leaves the old content whole. A symlink is written through to its target; an
    existing file keeps its mode, a new one gets the usual ``0o666 & ~umask``. A FIFO, socket or
    device is refused."""
    data = base64.b64decode(req["data"])
    real = os.path.realpath(host_path(req["path"]))
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    else:
        if special_kind(st.st_mode) is not None:
            _refuse_special(st, real)
        mode = stat.S_IMODE(st.st_mode)
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


def op_write_at(req: dict) -> dict:
    """Write ``data`` at ``offset`` of a regular file (created with ``mode`` if missing, never
    through a symlink), after setting its length to ``size`` when given: how sparse files are
    filled in without writing their holes."""
    data = base64.b64decode(req["data"])
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(host_path(req["path"]), flags, int(req.get("mode") or 0o644))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse_special(st, req["path"])
        if req.get("size") is not None:
            os.ftruncate(fd, int(req["size"]))
        view, offset = memoryview(data), int(req.get("offset") or 0)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
    finally:
        os.close(fd)
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


# --- the host's snapshot of the workspace, and the processes it may not outlive -----------------
#: ``tree`` stops after this many entries (``complete`` False).
MAX_TREE_ENTRIES = 500_000
#: Bytes read at a time when hashing.
HASH_CHUNK = 1 << 20


def _processes() -> dict[int, tuple[int, str]]:
    """``pid -> (parent pid, state)`` of every process this runner can see in ``/proc``."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) >= 2 and fields[1].isdigit():
            found[int(name)] = (int(fields[1]), fields[0])
    return found


def _others_alive() -> list[int]:
    """The live processes that ``stop_all`` must end: in a container every one but init and the
    runner; locally the runner's descendants. Zombies are dead (their parent reaps them)."""
    me = os.getpid()
    table = _processes()
    if MODE != "local":
        return sorted(p for p, (_, state) in table.items() if p not in (1, me) and state != "Z")
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(me, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return sorted(p for p in found if table[p][1] != "Z")


def _reap_orphans() -> None:
    """Local mode: collect the exit status of orphans reparented to this runner (it is their
    subreaper), never that of a command an ``exec`` waits for."""
    me = os.getpid()
    with _spawn_lock:
        with _groups_lock:
            running = set(_running_groups)
        for pid, (ppid, state) in _processes().items():
            if ppid == me and state == "Z" and pid not in running:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def op_stop_all(req: dict) -> dict:
    """Kill every process the commands started, wherever it went (its own session, a double fork),
    and wait until none is left (at most ``timeout_s``): after this, nothing changes the workspace
    but this runner. Answers how many were killed and which are still there (none, normally)."""
    deadline = time.monotonic() + float(req.get("timeout_s") or 10.0)
    killed: set[int] = set()
    while True:
        alive = _others_alive()
        if not alive or time.monotonic() > deadline:
            break
        if MODE == "local":
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        else:
            try:  # every process it may signal but init and itself, in one step of the kernel
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed.update(alive)
        if MODE == "local":
            _reap_orphans()
        time.sleep(0.02)
    return {"killed": len(killed), "left": alive}


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    while True:
        chunk = os.read(fd, HASH_CHUNK)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)


def _check_rel(rel: str) -> list[str]:
    """The parts of a path relative to the workspace; ``ValueError`` for one that could leave it."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a plain relative path: {rel!r}")
    return parts


def _dir_fd(parts: list[str], *, create: bool) -> int:
    """A descriptor of the folder ``parts`` below the workspace root, never through a symlink
    (each step opened with ``O_NOFOLLOW``); ``create`` makes missing folders."""
    fd = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o777 & ~_UMASK | 0o700, dir_fd=fd)
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def op_tree(req: dict) -> dict:
    """Every entry below the workspace as ``[path, kind, mode, size, link target or special kind,
    sha256]``, paths relative to it; ``.git`` itself is never listed, symlinks are never followed.

    Kinds: ``dir``, ``file``, ``link``, ``special`` (FIFO, socket, device: never opened), ``repo`` (a
    folder holding a ``.git``: a nested repository, not entered) and ``unreadable``.

    - ``prune``: folders listed but not entered.
    - ``dirs_only``: folders and ``.gitignore`` files only.
    - ``hash``: the sha256 of each regular file.
    """
    prune = set(req.get("prune") or ())
    dirs_only, want_hash = bool(req.get("dirs_only")), bool(req.get("hash"))
    limit = min(int(req.get("max_entries") or MAX_TREE_ENTRIES), MAX_TREE_ENTRIES)
    entries: list[list] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        real_dir = os.path.join(ROOT, rel_dir) if rel_dir else ROOT
        try:
            names = sorted(os.listdir(real_dir))
        except OSError:
            entries.append([rel_dir, "unreadable", 0, 0, None, None])
            continue
        for name in names:
            if name == ".git":
                continue
            if len(entries) >= limit:
                return {"entries": entries, "complete": False}
            rel = f"{rel_dir}/{name}" if rel_dir else name
            real = os.path.join(real_dir, name)
            try:
                st = os.lstat(real)
            except OSError:
                continue
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if os.path.lexists(os.path.join(real, ".git")):
                    entries.append([rel, "repo", stat.S_IMODE(mode), 0, None, None])
                    continue
                entries.append([rel, "dir", stat.S_IMODE(mode), 0, None, None])
                if rel not in prune:
                    stack.append(rel)
            elif dirs_only:
                if name == ".gitignore" and stat.S_ISREG(mode):
                    entries.append([rel, "file", stat.S_IMODE(mode), st.st_size, None, None])
            elif stat.S_ISLNK(mode):
                try:
                    target = os.readlink(real)
                except OSError:
                    target = None
                entries.append([rel, "link", stat.S_IMODE(mode), 0, target, None])
            elif stat.S_ISREG(mode):
                digest = None
                if want_hash:
                    try:
                        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    except OSError:
                        entries.append([rel, "unreadable", 0, 0, None, None])
                        continue
                    try:
                        st = os.fstat(fd)
                        digest = _sha256(fd) if stat.S_ISREG(st.st_mode) else None
                    finally:
                        os.close(fd)
                entries.append([rel, "file", stat.S_IMODE(st.st_mode), st.st_size, None, digest])
            else:
                entries.append([rel, "special", 0, 0, special_kind(mode), None])
    return {"entries": entries, "complete": True}


#: ``fingerprint`` gives up (no fingerprint) past this many entries: a look through git is then due.
MAX_FINGERPRINT_ENTRIES = 200_000
#: An entry changed this recently may change again within the same file-system timestamp tick
#: (milliseconds), unseen by its stat data: a fingerprint holding one vouches for nothing.
RACY_NS = 100_000_000
#: The files of a ``.git`` folder that decide which work-tree files git takes (its walk skips the rest).
GIT_FILES = ("index", "info/exclude", "config")


def op_fingerprint(req: dict) -> dict:
    """A digest of the stat data of every entry below the workspace: two equal digests mean nothing
    there changed in between, since a write changes the change time, which no program can set back.

    The stat data: path, mode, size, inode, modification and change times. Symlinks are not followed;
    ``.git`` folders are not entered (only the files of theirs that decide what git takes,
    :data:`GIT_FILES`).

    The digest is None when an entry changed within :data:`RACY_NS` of the walk (a change in the same
    timestamp tick would go unseen) or past :data:`MAX_FINGERPRINT_ENTRIES` entries.
    """
    started = time.time_ns()
    digest = hashlib.sha256()
    count = 0
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            digest.update(f"{folder}\0unreadable {exc.errno}\n".encode("utf-8", "surrogateescape"))
            continue
        for entry in entries:
            count += 1
            if count > MAX_FINGERPRINT_ENTRIES:
                return {"digest": None, "entries": count, "why": "too many entries"}
            paths = [entry.path]
            if entry.name == ".git" and entry.is_dir(follow_symlinks=False):  # its own times change
                paths = [os.path.join(entry.path, name) for name in GIT_FILES]  # with every git command
            elif entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            for path in paths:
                try:
                    st = os.lstat(path)
                except OSError:
                    digest.update(f"{path}\0-\n".encode("utf-8", "surrogateescape"))
                    continue
                if max(st.st_ctime_ns, st.st_mtime_ns) >= started - RACY_NS:
                    return {"digest": None, "entries": count, "why": "changed just now"}
                digest.update(
                    f"{path}\0{st.st_mode} {st.st_size} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns}\n".encode(
                        "utf-8", "surrogateescape"
                    )
                )
    return {"digest": digest.hexdigest(), "entries": count, "why": None}


def op_read_many(req: dict) -> dict:
    """The bytes of regular files (``paths`` relative to the workspace, never through a symlink),
    ``[path, base64 data or None, error or None]`` each, in order, until ``max_bytes`` would be
    passed: the host asks again for the rest."""
    limit = min(int(req.get("max_bytes") or MAX_READ_BYTES), MAX_READ_BYTES)
    out: list[list] = []
    total = 0
    for rel in req["paths"]:
        try:
            parts = _check_rel(rel)
            dfd = _dir_fd(parts[:-1], create=False)
            try:
                fd = os.open(
                    parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                )
            finally:
                os.close(dfd)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                if out and total + st.st_size > limit:
                    break
                if st.st_size > limit:
                    raise _too_large(st.st_size, limit)
                data = f.read(limit + 1)
            if len(data) > limit:
                raise _too_large(len(data), limit)
            total += len(data)
            out.append([rel, base64.b64encode(data).decode(), None])
        except (OSError, ValueError, Refused) as exc:
            out.append([rel, None, getattr(exc, "strerror", None) or str(exc)])
    return {"files": out}


def op_copy(req: dict) -> dict:
    """Copy the regular file ``src`` over ``dst`` (paths relative to the workspace, never read or
    written through a symlink; replaced atomically) and date the copy ``mtime_ns``. When ``src``
    is missing, ``dst`` is removed: ``{"copied": false}``."""
    src, dst = _check_rel(req["src"]), _check_rel(req["dst"])
    sdfd = _dir_fd(src[:-1], create=False)
    try:
        ddfd = _dir_fd(dst[:-1], create=False)
    except BaseException:
        os.close(sdfd)
        raise
    try:
        try:
            fd = os.open(src[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sdfd)
        except FileNotFoundError:
            try:
                os.unlink(dst[-1], dir_fd=ddfd)
            except FileNotFoundError:
                pass
            return {"copied": False}
        tmp = f".clover-copy-{os.getpid()}-{threading.get_ident()}"
        try:
            _refuse_special(os.fstat(fd), req["src"])
            out = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=ddfd
            )
            try:
                while chunk := os.read(fd, HASH_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                mtime = int(req["mtime_ns"])
                os.utime(out, ns=(mtime, mtime))
            finally:
                os.close(out)
            os.replace(tmp, dst[-1], src_dir_fd=ddfd, dst_dir_fd=ddfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=ddfd)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        return {"copied": True}
    finally:
        os.close(sdfd)
        os.close(ddfd)


def op_put(req: dict) -> dict:
    """Make entries of the workspace what the host says, in order: ``[path, "file", mode, base64
    data]`` (replaced atomically, parents made), ``[path, "link", 0, target]``, ``[path, "absent"]``
    (a file, link or whole folder removed). Never through a symlink: each folder on the way is
    opened with ``O_NOFOLLOW``."""
    for entry in req["entries"]:
        rel, kind = entry[0], entry[1]
        parts = _check_rel(rel)
        dfd = _dir_fd(parts[:-1], create=kind != "absent")
        name = parts[-1]
        try:
            if kind == "absent":
                try:
                    st = os.lstat(name, dir_fd=dfd)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(os.path.join(ROOT, rel))
                else:
                    os.unlink(name, dir_fd=dfd)
                continue
            tmp = f".clover-put-{os.getpid()}-{threading.get_ident()}"
            if kind == "file":
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                    dir_fd=dfd,
                )
                with os.fdopen(fd, "wb") as f:
                    f.write(base64.b64decode(entry[3]))
                    os.fchmod(f.fileno(), int(entry[2]) & 0o7777)
            elif kind == "link":
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                os.symlink(entry[3], tmp, dir_fd=dfd)
            else:
                raise ValueError(f"unknown entry kind {kind!r}")
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=dfd).st_mode):
                    os.rmdir(name, dir_fd=dfd)  # an emptied folder that becomes a file
            except FileNotFoundError:
                pass
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
    return {}


OPS = {
    "exec": op_exec,
    "stop_all": op_stop_all,
    "tree": op_tree,
    "fingerprint": op_fingerprint,
    "read_many": op_read_many,
    "put": op_put,
    "copy": op_copy,
    "cancel": op_cancel,
    "read": op_read,
    "read_lines": op_read_lines,
    "write": op_write,
    "write_at": op_write_at,
    "list": op_list,
    "stat": op_stat,
    "realpath": op_realpath,
}


def respond(message: dict) -> None:
    """Send one answer line: its MAC, a space, the JSON text (ASCII), ``id`` first (the host finds
    an answer behind bytes a command wrote into the stream by its ``MAC {"id":``)."""
    message = {"id": message.get("id"), **message}
    text = json.dumps(message, separators=(",", ":"))
    if len(text) > MAX_RESPONSE_CHARS:
        text = json.dumps(
            {
                "id": message.get("id"),
                "ok": False,
                "error": "ResponseTooLarge",
                "message": f"the answer would be {len(text)} characters, over {MAX_RESPONSE_CHARS}",
            }
        )
    data = text.encode("ascii")
    mac = hmac.new(_key, data, hashlib.sha256).hexdigest().encode("ascii")
    with _write_lock:
        sys.stdout.buffer.write(mac + b" " + data + b"\n")
        sys.stdout.buffer.flush()


def handle(req: dict) -> None:
    base = {"id": req.get("id"), "ok": False}
    try:
        result = OPS[req["op"]](req)
        result.update(id=req["id"], ok=True)
        respond(result)
    except Refused as exc:
        respond({**base, "error": exc.name, "message": str(exc), **exc.fields})
    except ValueError as exc:  # a NUL byte, a lone surrogate, a bad name: the request, not the runner
        respond({**base, "error": "InvalidArgument", "message": str(exc)})
    except Exception as exc:
        respond(
            {
                **base,
                "error": type(exc).__name__,
                "errno": getattr(exc, "errno", None),
                "message": str(exc),
            }
        )


def main() -> None:
    global _key
    _key = bytes.fromhex(sys.stdin.readline().strip())
    undumpable = _make_undumpable()
    if MODE == "local":
        _make_subreaper()
    respond({"id": 0, "ok": True, "ready": True, "pid": os.getpid(), "root": ROOT, "undumpable": undumpable})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("a request must be a JSON object")
        except ValueError as exc:
            respond({"id": None, "ok": False, "error": "InvalidArgument", "message": f"bad request: {exc}"})
            continue
        try:
            threading.Thread(target=handle, args=(req,), daemon=True).start()
        except RuntimeError:  # no thread left under the pid limit: run it here
            handle(req)
    # The host went away (closed or killed): nothing started here may outlive it.
    with _groups_lock:
        for pgid in list(_running_groups):
            _kill_group(pgid)
    if MODE == "local":  # nor what left its group: the daemons the commands started
        op_stop_all({"timeout_s": 5.0})


if __name__ == "__main__":
    main()
