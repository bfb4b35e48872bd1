"""Making a sandbox: ``create_sandbox("docker" | "local", spec)`` builds one (not yet started);
use it as ``async with sandbox: ...``. The spec is complete (:class:`~clover_agent.sandboxes.base.SandboxSpec`);
the errors are this package's own (:mod:`clover_agent.sandboxes.errors`)."""

from __future__ import annotations

from typing import Literal

from clover_agent.sandboxes.base import Sandbox, SandboxSpec
from clover_agent.sandboxes.errors import SandboxConfigError

SandboxKind = Literal["docker", "local"]
SANDBOX_KINDS: tuple[str, ...] = ("docker", "local")
#: No sandbox: the folder itself, no isolation (``run --sandbox none``, inside a throwaway container).
IN_PLACE = "none"


def create_sandbox(kind: SandboxKind | str, spec: SandboxSpec) -> Sandbox:
    """A not-yet-started sandbox of ``kind`` for ``spec``."""
    if kind == "local":
        from clover_agent.sandboxes.local import LocalSandbox

        return LocalSandbox(spec)
    if kind == "docker":
        from clover_agent.sandboxes.docker import DockerSandbox

        return DockerSandbox(spec)
    if kind == IN_PLACE:  # only `clover-agent run --sandbox none` names it: not in SANDBOX_KINDS
        from clover_agent.sandboxes.inplace import InPlaceSandbox

        return InPlaceSandbox(spec)
    raise SandboxConfigError(f"unknown sandbox kind {kind!r}: choose one of {', '.join(SANDBOX_KINDS)}")
