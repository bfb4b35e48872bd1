"""Child process for the lifecycle tests: start a sandbox, print what identifies it, then wait.

Usage: python hold_sandbox.py KIND REPO [raise]. Prints one JSON line (``{"ready": ...}``) once the
sandbox runs, then sleeps until signalled, or raises an exception when ``raise`` is given.
"""

from __future__ import annotations

import asyncio
import json
import sys

from clover_agent.sandboxes import SandboxSpec, create_sandbox


async def hold(kind: str, repo: str, then_raise: bool) -> None:
    async with create_sandbox(kind, SandboxSpec(repo=repo)) as sandbox:
        ident = getattr(sandbox, "container_id", None) or str(getattr(sandbox, "host_workspace", ""))
        print(json.dumps({"ready": ident}), flush=True)
        if then_raise:
            raise RuntimeError("boom inside the sandbox block")
        await asyncio.sleep(600)


if __name__ == "__main__":
    asyncio.run(hold(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "raise"))
