"""Child process for the lifecycle tests: start a sandbox, print what identifies it, then wait.

Usage: python hold_sandbox.py KIND REPO [MODE]. Prints one JSON line (``{"ready": ...}``) once the
sandbox runs, then sleeps until signalled. MODE changes what the process does:

- ``raise``: raise an exception inside the sandbox block instead of sleeping;
- ``ignore-SIGINT`` / ``ignore-SIGTERM``: ignore that signal before the sandbox starts (as a shell
  does for a background job);
- ``handle-SIGTERM``: install a Python SIGTERM handler before the sandbox starts; it prints
  ``previous handler ran`` and exits with status 3.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from types import FrameType

from clover_agent.sandboxes import SandboxSpec, create_sandbox

EXIT_FROM_OWN_HANDLER = 3


def own_sigterm_handler(signum: int, frame: FrameType | None) -> None:
    print("previous handler ran", flush=True)
    sys.exit(EXIT_FROM_OWN_HANDLER)


async def hold(kind: str, repo: str, mode: str) -> None:
    async with create_sandbox(kind, SandboxSpec(repo=repo)) as sandbox:
        ident = getattr(sandbox, "container_id", None) or str(getattr(sandbox, "host_workspace", ""))
        print(json.dumps({"ready": ident}), flush=True)
        if mode == "raise":
            raise RuntimeError("boom inside the sandbox block")
        await asyncio.sleep(600)


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode.startswith("ignore-"):
        signal.signal(signal.Signals[mode.removeprefix("ignore-")], signal.SIG_IGN)
    elif mode == "handle-SIGTERM":
        signal.signal(signal.SIGTERM, own_sigterm_handler)
    asyncio.run(hold(sys.argv[1], sys.argv[2], mode))
