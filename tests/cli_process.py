"""``clover-agent`` run as a user runs it: a separate Python process, its output captured."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
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


def run_at_a_terminal(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    answers: Sequence[tuple[str, str]] = (),
    cwd: Path | None = None,
    timeout: float = 300,
) -> tuple[int, str]:
    """``clover-agent ARGS`` with stdin, stdout and stderr on one pseudo-terminal, as a person runs
    it; its exit code and everything the terminal showed (raw: styles and cursor moves included).
    ``env`` is added to this process's environment (a 120x40 terminal unless it says otherwise);
    each of ``answers`` (text, reply) types ``reply`` once ``text`` has shown, in order."""
    main_fd, terminal_fd = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "clover_agent", *args], stdin=terminal_fd, stdout=terminal_fd,
        stderr=terminal_fd, close_fds=True, cwd=cwd, preexec_fn=_default_signals,
        env={**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color", **(env or {})},
    )  # fmt: skip
    os.close(terminal_fd)
    pending = list(answers)
    shown = b""
    answered = 0  # where the text of the next answer is looked for
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 1.0)
        if not ready:
            if child.poll() is not None:
                break
            continue
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
        while pending and shown.find(pending[0][0].encode(), answered) >= 0:
            text, reply = pending.pop(0)
            answered = shown.find(text.encode(), answered) + len(text.encode())
            os.write(main_fd, reply.encode())
    os.close(main_fd)
    if child.poll() is None:
        child.kill()
    return child.wait(timeout=60), shown.decode(errors="replace").replace("\r\n", "\n")
