"""``clover-agent`` run as a user runs it: a separate Python process, its output captured."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any


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


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_signalable(command: list[str], **popen: Any) -> subprocess.Popen:
    """A child process the test will send SIGINT or SIGTERM: both at their default disposition in
    it, whatever this process has. A test run started in the background by a shell (``nohup make
    test &``) has SIGINT ignored, and a child inherits that: the Ctrl-C a test sends would do
    nothing, and the child would run on (or to its end)."""
    return subprocess.Popen(command, preexec_fn=_default_signals, **popen)
