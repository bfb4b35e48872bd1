"""The sandbox interface every tool runs through.

The model sees one workspace at ``/workspace`` whatever the backend: paths passed to these methods
are paths in the sandbox's namespace (``/workspace/src/x.py``), never host paths. Backends:
``DockerSandbox`` (default, isolated) and ``LocalSandbox`` (opt-in, a private copy on the host).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from clover_agent.sandboxes.errors import SandboxConfigError, SandboxError

__all__ = ["WORKSPACE", "ExecResult", "FileEntry", "Sandbox", "SandboxError", "SandboxLimits", "SandboxSpec"]

WORKSPACE = "/workspace"


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
