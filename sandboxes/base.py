"""The sandbox interface every tool runs through.

The model sees one workspace at ``/workspace`` whatever the backend: paths passed to these methods
are paths in the sandbox's namespace (``/workspace/src/x.py``), never host paths. Backends:
``DockerSandbox`` (default, isolated) and ``LocalSandbox`` (opt-in, a private copy on the host).
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from clover_agent.environments.recipe import EnvironmentRecipe
from clover_agent.sandboxes.errors import SandboxArgumentError, SandboxConfigError, SandboxError

__all__ = [
    "MAX_READ_BYTES",
    "WORKSPACE",
    "ExecResult",
    "FileEntry",
    "FileTooLargeError",
    "LineRange",
    "Listing",
    "OutputSink",
    "Put",
    "Sandbox",
    "SandboxArgumentError",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "SpecialFileError",
    "TreeEntry",
]

WORKSPACE = "/workspace"

#: Where a command's output goes as it comes (:meth:`Sandbox.exec`'s ``on_output``): pieces of
#: text, for a display only (they may skip bytes when a command prints fast; the result holds all).
OutputSink = Callable[[str], None]


class SpecialFileError(OSError):
    """The path (or the file a symlink points to) is a FIFO, socket or device: file operations never
    open those, since reading one can block forever or never end. ``kind`` names it ("FIFO", ...)."""

    def __init__(self, kind: str, path: object) -> None:
        super().__init__(errno.EINVAL, f"it is a {kind}, not a regular file", path)
        self.kind = kind


class FileTooLargeError(OSError):
    """A read refused before any content moved: the file has ``size`` bytes, over ``limit``."""

    def __init__(self, size: int, limit: int, path: object) -> None:
        super().__init__(errno.EFBIG, f"the file is {size:,} bytes, over the {limit:,}-byte limit", path)
        self.size = size
        self.limit = limit


#: The most a single ``read_file`` returns (reads of larger files are refused before anything moves).
MAX_READ_BYTES = 64 * 1024 * 1024


@dataclass
class ExecResult:
    """Outcome of one command. ``output`` is stdout and stderr interleaved as produced."""

    exit_code: int | None  # None when the command was killed (timeout) before it exited
    output: str
    timed_out: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False
    killed_reason: str | None = None  # e.g. "timeout after 3.0 s", "out of memory", "pid limit"
    pid_limit_hit: bool = False  # some fork failed because the sandbox's process limit was reached
    disk_full: str | None = None  # set when the workspace or /tmp ran out of space: usage in words


@dataclass
class FileEntry:
    path: str  # sandbox path
    is_dir: bool
    size: int = 0
    is_symlink: bool = False
    special: str | None = None  # "FIFO", "socket", "character device", "block device"; None otherwise


@dataclass
class Listing:
    """What :meth:`Sandbox.list_entries` found: at most the entries asked for, and how many there
    are in all (``complete`` False when the count stopped early, at a million)."""

    entries: list[FileEntry]
    total: int
    complete: bool = True

    @property
    def left_out(self) -> int:
        return self.total - len(self.entries)


@dataclass
class LineRange:
    """Lines ``first..last`` (1-based) of a file, as read by :meth:`Sandbox.read_lines`."""

    data: bytes  # the lines' bytes, line breaks included
    first: int
    last: int  # the last line in ``data`` (``first - 1`` when none)
    total_lines: int | None  # None when the file was too long to count to its end
    size: int  # the file's size in bytes
    binary: bool  # a NUL byte in the file's first 8 KiB
    truncated: bool  # ``data`` stopped before ``last`` because of the byte limit


@dataclass(frozen=True)
class TreeEntry:
    """One entry of :meth:`Sandbox.tree`: what the workspace holds at ``path`` (relative to it,
    ``/``-separated; an undecodable name in ``surrogateescape`` form)."""

    path: str
    #: "dir", "file", "link", "special" (FIFO, socket, device), "repo" (a folder with a ``.git``
    #: of its own, not entered) or "unreadable"
    kind: str
    mode: int = 0  # permission bits
    size: int = 0
    target: str | None = None  # a link's target; a special file's kind ("FIFO (named pipe)", ...)
    sha256: str | None = None  # a regular file's, when asked for


@dataclass(frozen=True)
class Put:
    """What :meth:`Sandbox.put` makes of ``path`` (relative to the workspace): a file with ``data``
    and ``mode``, a symlink to ``target``, or nothing ("absent": a file, link or folder removed)."""

    path: str
    kind: str  # "file" | "link" | "absent"
    mode: int = 0o644
    data: bytes = b""
    target: str = ""


@dataclass
class SandboxLimits:
    cpus: float = 2.0
    memory_bytes: int = 4 * 1024**3
    pids: int = 512
    #: Space for /workspace. Docker: a size-limited tmpfs (held in RAM, counted in ``memory_bytes``);
    #: local: only the copy's size is checked and each file is capped (see sandboxes/README.md).
    disk_bytes: int = 2 * 1024**3


@dataclass
class SandboxSpec:
    """Everything a sandbox needs, complete: a sandbox never reads settings, configuration files or
    the environment. ``clover_agent.launch.sandbox_spec`` builds one from the command's options,
    the repository's ``.clover/config.toml`` and the user's settings."""

    repo: str  # host path of the repository to copy (the user's tree is never mounted)
    image: str | None = None  # the Docker image to start (required by the Docker sandbox)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: bool = False  # network during the agent's work (off by default)
    setup_commands: list[str] = field(default_factory=list)  # run once before the agent starts
    setup_network: bool = False  # network only while the setup commands run
    setup_timeout: float = 1800.0  # seconds, per set-up command
    #: The project's environment (:mod:`clover_agent.environments.recipe`): made once per
    #: dependency state and cached as an image by the Docker sandbox; None: the image as it is.
    #: The local sandbox uses this machine's Python and ignores it.
    environment: EnvironmentRecipe | None = None
    #: The Docker sandbox starts from the compiler variant of ``image`` (gcc, libc6-dev and the
    #: Python headers added; built once and cached: :func:`clover_agent.sandboxes.images.compiler_image`).
    #: The local sandbox uses this machine's compiler, if any, and ignores it.
    compiler: bool = False
    #: Told what a long start is doing (the environment's set-up, a large copy), one line each.
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    env: dict[str, str] = field(default_factory=dict)  # variables set for every command inside
    #: The host environment the sandbox may draw on: the local sandbox's commands inherit it (then
    #: ``env``); the Docker sandbox reads its engine's address from it (``DOCKER_HOST``,
    #: ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``; none: the default socket). Never passed into
    #: a container.
    host_env: dict[str, str] = field(default_factory=dict)


def require_repo(spec: SandboxSpec) -> None:
    """:class:`SandboxConfigError` when the spec's repository folder is not there (checked before
    anything is made)."""
    if not Path(spec.repo).is_dir():
        raise SandboxConfigError(f"the repository folder {spec.repo} does not exist or is not a folder")


@dataclass(frozen=True)
class Attached:
    """A command line to run on the host that runs a program inside the sandbox with its stdin and
    stdout attached to the host's pipes (an MCP server over stdio): ``argv`` started in ``cwd``
    with ``env`` as its whole environment."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str]


class Sandbox(abc.ABC):
    """Async interface; one instance per task. Use as ``async with sandbox: ...``."""

    workspace: str = WORKSPACE
    #: A caution to show the user while this sandbox is in use (the local sandbox does not isolate).
    warning: str | None = None
    #: The commit ``diff()`` compares against (the workspace as it was after the set-up
    #: commands), once started; None where the sandbox has none.
    base_commit: str | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the workspace copy (and container), run setup commands, record the base commit."""

    @abc.abstractmethod
    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        on_output: OutputSink | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``bash -c`` in its own process group, stdin closed.

        On timeout the whole process group is killed and ``timed_out`` is set; the sandbox stays
        usable. ``on_output`` is called on the caller's event loop with pieces of the output while
        the command runs (coalesced, raw as printed: a display sanitises them), all before it returns.
        """

    def attached(self, argv: list[str], env: dict[str, str] | None = None) -> Attached:
        """How to run ``argv`` inside this (started) sandbox with its stdin and stdout attached, in
        the workspace, with ``env`` added to the sandbox's environment. It gets no network where the
        sandbox's commands get none. Raises :class:`SandboxError` where the sandbox cannot."""
        raise SandboxError(f"the {type(self).__name__} cannot run a program attached to the host")

    @abc.abstractmethod
    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        """The file's bytes. Raises :class:`FileTooLargeError` (before reading) when it is over
        ``max_bytes`` (at most :data:`MAX_READ_BYTES`), :class:`SpecialFileError` for a FIFO, socket
        or device (never opened), and the usual ``OSError`` subclasses."""

    @abc.abstractmethod
    async def read_lines(self, path: str, first: int, last: int, *, max_bytes: int) -> LineRange:
        """Lines ``first..last`` (1-based, ``last`` -1 = to the end) of a file of any size, read in
        the sandbox so only those lines (at most ``max_bytes`` of them) move."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write (create or replace) a file, creating parent folders, keeping the file's mode."""

    @abc.abstractmethod
    async def list_files(self, path: str, max_depth: int = 2) -> list[FileEntry]:
        """Entries below ``path`` down to ``max_depth`` levels, sorted by path (at most 100,000).
        ``.git`` and symlinked folders are listed but not entered."""

    @abc.abstractmethod
    async def list_entries(
        self, path: str, max_depth: int, *, max_entries: int, skip_hidden: bool = False
    ) -> Listing:
        """Like :meth:`list_files`, but at most ``max_entries`` entries move, with the total;
        ``skip_hidden`` leaves out (and does not enter) names starting with ``.``."""

    @abc.abstractmethod
    async def stat(self, path: str) -> FileEntry | None:
        """The entry for ``path``, or None when nothing is there. ``is_symlink`` says whether ``path``
        itself is a link; ``is_dir`` and ``size`` follow it."""

    @abc.abstractmethod
    async def realpath(self, path: str) -> str:
        """The fully resolved path inside the sandbox (symlinks followed; missing tails kept)."""

    @abc.abstractmethod
    async def stop_processes(self) -> int:
        """Kill every process the sandbox's commands started, wherever it went (a ``setsid`` or
        double-forked daemon included), and wait until none is left: afterwards nothing but the
        sandbox's own runner touches the workspace. Returns how many were killed; raises
        :class:`SandboxError` when some survive."""

    @abc.abstractmethod
    async def tree(
        self, *, prune: list[str] | None = None, dirs_only: bool = False, hashes: bool = False
    ) -> list[TreeEntry]:
        """Every entry below the workspace (``.git`` left out, symlinks never followed, folders in
        ``prune`` not entered); ``dirs_only``: folders and ``.gitignore`` files; ``hashes``: each
        regular file's sha256. :class:`SandboxError` when the workspace has too many entries."""

    async def fingerprint(self) -> str | None:
        """A digest of every workspace entry's stat data: equal digests mean nothing in the
        workspace changed in between, so a caller can skip looking through git. None when it
        cannot vouch for that (an entry changed just now, too many entries, or a sandbox that
        has no fingerprint): look."""
        return None

    async def copy_file(self, src: str, dst: str, *, mtime_ns: int) -> bool:
        """Copy the regular file ``src`` over ``dst`` (paths relative to the workspace, never
        through a symlink) and date the copy ``mtime_ns``; False (``dst`` removed) when ``src`` is
        missing. ``OSError`` when it cannot be done (a sandbox without it: ``NotImplementedError``)."""
        raise NotImplementedError(f"the {type(self).__name__} cannot copy files")

    @abc.abstractmethod
    async def read_files(self, paths: list[str]) -> dict[str, bytes | str]:
        """The bytes of each regular file in ``paths`` (relative to the workspace, never read
        through a symlink), or why it could not be read (a str). The caller keeps the total small
        enough to hold (see :data:`MAX_READ_BYTES`)."""

    @abc.abstractmethod
    async def put(self, entries: list[Put]) -> None:
        """Make each entry of the workspace what ``entries`` say, in order (files replaced
        atomically, never written through a symlink)."""

    @abc.abstractmethod
    async def diff(self) -> str:
        """``git diff`` of the workspace (including new files) against the starting commit."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything (remove the container / private copy). Safe to call twice."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
