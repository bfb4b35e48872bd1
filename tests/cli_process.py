"""``clover-agent`` run as a user runs it: a separate Python process, its output captured."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m clover_agent args...``; ``env`` is added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "clover_agent", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
