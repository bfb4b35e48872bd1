"""Where tools run: Docker (default) and local (opt-in) (imports as ``clover_agent.sandboxes``).

``create_sandbox("docker" | "local", spec)`` builds one; use it as ``async with sandbox: ...``.
The spec is complete (see :class:`SandboxSpec`); the errors are this package's own
(:mod:`clover_agent.sandboxes.errors`).
"""

from __future__ import annotations

from typing import Literal

from clover_agent.sandboxes.base import (
    MAX_READ_BYTES,
    WORKSPACE,
    ExecResult,
    FileEntry,
    FileTooLargeError,
    LineRange,
    Listing,
    Put,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    SpecialFileError,
    TreeEntry,
)
from clover_agent.sandboxes.errors import (
    SandboxArgumentError,
    SandboxConfigError,
    SandboxError,
    SandboxUnavailable,
)

SandboxKind = Literal["docker", "local"]
SANDBOX_KINDS: tuple[str, ...] = ("docker", "local")

__all__ = [
    "MAX_READ_BYTES",
    "SANDBOX_KINDS",
    "WORKSPACE",
    "ExecResult",
    "FileEntry",
    "FileTooLargeError",
    "LineRange",
    "Listing",
    "Put",
    "Sandbox",
    "SandboxArgumentError",
    "SandboxConfigError",
    "SandboxError",
    "SandboxKind",
    "SandboxLimits",
    "SandboxSpec",
    "SandboxUnavailable",
    "SpecialFileError",
    "TreeEntry",
    "create_sandbox",
]


def create_sandbox(kind: SandboxKind | str, spec: SandboxSpec) -> Sandbox:
    """A not-yet-started sandbox of ``kind`` for ``spec``."""
    if kind == "local":
        from clover_agent.sandboxes.local import LocalSandbox

        return LocalSandbox(spec)
    if kind == "docker":
        from clover_agent.sandboxes.docker import DockerSandbox

        return DockerSandbox(spec)
    raise SandboxConfigError(f"unknown sandbox kind {kind!r}: choose one of {', '.join(SANDBOX_KINDS)}")
