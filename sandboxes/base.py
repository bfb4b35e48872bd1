"""The sandbox interface every tool runs through.

The model sees one workspace at ``/workspace`` whatever the backend: paths passed to these methods
are paths in the sandbox's namespace (``/workspace/src/x.py``), never host paths. Backends:
``DockerSandbox`` (default, isolated) and ``LocalSandbox`` (opt-in, a private copy on the host).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from clover_agent.errors import CloverError, ExitCode
from clover_agent.sandboxes.environment import EnvironmentRecipe

WORKSPACE = "/workspace"


class SandboxError(CloverError):
    """The sandbox broke while in use (its runner or container died, e.g. killed out of memory).

    File operations raise the usual ``OSError`` subclasses (``FileNotFoundError``, ...) with the
    sandbox path instead.
    """

    exit_code = ExitCode.SANDBOX_UNAVAILABLE


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


@dataclass
class FileEntry:
    path: str  # sandbox path
    is_dir: bool
    size: int = 0
    is_symlink: bool = False


@dataclass
class SandboxLimits:
    cpus: float = 2.0
    memory_bytes: int = 4 * 1024**3
    pids: int = 512


@dataclass
class SandboxSpec:
    """What to start: a repository copied into ``/workspace`` and how to prepare it."""

    repo: str  # host path of the repository to copy (the user's tree is never mounted)
    image: str | None = None  # Docker only; None = configured default
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: bool = False  # network during the agent's work (off by default)
    setup_commands: list[str] = field(default_factory=list)  # run once before the agent starts
    setup_network: bool = False  # network only while the setup commands run
    setup_timeout: float = 1800.0  # seconds, per set-up command
    #: The project's environment (:mod:`clover_agent.sandboxes.environment`): made once per
    #: dependency state and cached as an image by the Docker sandbox; None: the image as it is.
    #: The local sandbox uses this machine's Python and ignores it.
    environment: EnvironmentRecipe | None = None
    #: Told what a long start is doing (the environment's set-up, a large copy), one line each.
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    env: dict[str, str] = field(default_factory=dict)


class Sandbox(abc.ABC):
    """Async interface; one instance per task. Use as ``async with sandbox: ...``."""

    workspace: str = WORKSPACE
    #: A caution to show the user while this sandbox is in use (the local sandbox does not isolate).
    warning: str | None = None

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
    ) -> ExecResult:
        """Run ``command`` with ``bash -c`` in its own process group, stdin closed.

        On timeout the whole process group is killed and ``timed_out`` is set; the sandbox stays
        usable.
        """

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write (create or replace) a file, creating parent folders, keeping the file's mode."""

    @abc.abstractmethod
    async def list_files(self, path: str, max_depth: int = 2) -> list[FileEntry]:
        """Entries below ``path`` down to ``max_depth`` levels, sorted by path. ``.git`` and
        symlinked folders are listed but not entered."""

    @abc.abstractmethod
    async def stat(self, path: str) -> FileEntry | None:
        """The entry for ``path``, or None when nothing is there. ``is_symlink`` says whether ``path``
        itself is a link; ``is_dir`` and ``size`` follow it."""

    @abc.abstractmethod
    async def realpath(self, path: str) -> str:
        """The fully resolved path inside the sandbox (symlinks followed; missing tails kept)."""

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
