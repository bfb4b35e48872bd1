"""A private temporary folder inside a sandbox, for files handed between the host and a command
(a patch to apply, a test report to read back).

Never a fixed name in a shared ``/tmp``: under the local sandbox ``/tmp`` is the host's, shared
with every user and predictable. ``mktemp -d`` makes a fresh folder readable by its owner only,
under the sandbox's ``$TMPDIR`` (the local sandbox's private one) or the container's own ``/tmp``.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator

from clover_agent.sandboxes.base import Sandbox, SandboxError


@contextlib.asynccontextmanager
async def private_temp_dir(sandbox: Sandbox) -> AsyncIterator[str]:
    """A fresh folder in the sandbox (its sandbox path), removed with its contents on exit."""
    made = await sandbox.exec('mktemp -d "${TMPDIR:-/tmp}/clover.XXXXXXXXXX"', timeout=30)
    path = made.output.strip()
    if made.exit_code != 0 or not path.startswith("/") or "\n" in path:
        raise SandboxError(f"could not make a temporary folder in the sandbox: {made.output.strip()}")
    try:
        yield path
    finally:
        # A sandbox that stopped working takes its temporary folders with it; its error is not
        # news here and must not hide the one that ended the block.
        with contextlib.suppress(SandboxError):
            await sandbox.exec(f"rm -rf {shlex.quote(path)}", timeout=30)
