"""Child process for the lifecycle tests: start a sandbox, print what identifies it, then wait.

Usage: python hold_sandbox.py KIND REPO [MODE]. Prints one JSON line (``{"ready": ...}``) once the
sandbox runs, then waits until signalled, answering each line on stdin with
``{"alive": true, "sandbox": <the local copy still exists>}`` from the event loop's thread (where
signal handlers run: a signal sent before the line is handled before the answer). MODE changes what
the process does:

- ``raise``: raise an exception inside the sandbox block instead of sleeping;
- ``ignore-SIGINT`` / ``ignore-SIGTERM``: ignore that signal before the sandbox starts (as a shell
  does for a background job);
- ``handle-SIGTERM``: install a Python SIGTERM handler before the sandbox starts; it prints
  ``previous handler ran`` and exits with status 3.

``HOLD_SANDBOX_HOST_ID`` in the environment (set by ``own_leftovers`` in conftest.py) is the host
id its container is labelled with, so that only the test that started it reaps it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes import cleanup
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.settings import Settings

EXIT_FROM_OWN_HANDLER = 3


def own_sigterm_handler(signum: int, frame: FrameType | None) -> None:
    print("previous handler ran", flush=True)
    sys.exit(EXIT_FROM_OWN_HANDLER)


async def hold(kind: str, repo: str, mode: str) -> None:
    async with create_sandbox(kind, sandbox_spec(Settings.load(), repo)) as sandbox:
        ident = getattr(sandbox, "container_id", None) or str(getattr(sandbox, "host_workspace", ""))
        print(json.dumps({"ready": ident}), flush=True)
        if mode == "raise":
            raise RuntimeError("boom inside the sandbox block")
        loop = asyncio.get_running_loop()
        threading.Thread(target=read_pings, args=(loop, kind, ident), daemon=True).start()
        await asyncio.sleep(600)


def read_pings(loop: asyncio.AbstractEventLoop, kind: str, ident: str) -> None:
    for _ in sys.stdin:
        loop.call_soon_threadsafe(answer, kind, ident)


def answer(kind: str, ident: str) -> None:
    print(json.dumps({"alive": True, "sandbox": kind != "local" or Path(ident).is_dir()}), flush=True)


if __name__ == "__main__":
    cleanup.HOST_ID = os.environ["HOLD_SANDBOX_HOST_ID"]
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode.startswith("ignore-"):
        signal.signal(signal.Signals[mode.removeprefix("ignore-")], signal.SIG_IGN)
    elif mode == "handle-SIGTERM":
        signal.signal(signal.SIGTERM, own_sigterm_handler)
    asyncio.run(hold(sys.argv[1], sys.argv[2], mode))
