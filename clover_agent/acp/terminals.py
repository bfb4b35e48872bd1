"""Shell calls' output shown in the editor's own terminals (a client with the ``terminal``
capability), the command still running in the sandbox.

The model's command runs where it always runs: through the sandbox's exec, with the shell tool's
limits, its timeout and its kill on cancel, and the model reads the tool's result as ever. What
the editor's terminal runs is a fixed follower (this Python, :data:`FOLLOWER`) that copies a
private file of the session to its output as the command prints, and exits with the command's exit
code when it ends; so nothing the model writes ever runs on this machine. The output is made
inert first (escape sequences shown, not obeyed: :func:`~clover_agent.safe_text.terminal_safe`).
A terminal the person stops in the editor stops the command in the sandbox (``on_stopped``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_agent.safe_text import terminal_safe

log = logging.getLogger("clover_agent.acp")

#: The most of a command's output mirrored into a terminal (the model's result keeps its own).
MAX_MIRRORED_CHARS = 4 * 1024 * 1024
#: What the editor keeps of a terminal's output at most (bytes, from the end).
OUTPUT_BYTE_LIMIT = 1024 * 1024
#: How long the follower may take to show the end before it is released anyway.
EXIT_WAIT_S = 10.0
#: Copies the file argv[1] to stdout as it grows; once argv[2] holds the exit code, the rest, then
#: exits with that code. Ends (1) when its files are removed (the session closed).
FOLLOWER = """
import os, sys, time
out, done = sys.argv[1], sys.argv[2]
with open(out, "rb") as f:
    while True:
        ended = os.path.exists(done)
        piece = f.read(65536)
        if piece:
            sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
            continue
        if ended:
            with open(done) as d:
                code = d.read().strip()
            sys.exit(int(code) if code.lstrip("-").isdigit() else 1)
        if not os.path.exists(out):
            sys.exit(1)
        time.sleep(0.05)
"""


@dataclass
class Mirror:
    terminal_id: str
    out: Path
    done: Path
    written: int = 0


class Terminals:
    """The client terminals of one session's shell calls, by call id."""

    def __init__(
        self, conn: Any, session_id: str, cwd: Path, on_stopped: Callable[[str], None] | None = None
    ) -> None:
        self.conn = conn
        self.session_id = session_id
        self.cwd = cwd
        #: Told the call id when its terminal ended before the call did (the person stopped it).
        self.on_stopped = on_stopped
        self.folder: Path | None = None  # private (0700), made at the first terminal
        self.open: dict[str, Mirror] = {}
        self._made = 0
        self._ended: set[str] = set()  # calls whose terminal was released: never opened again
        self._watching: set[asyncio.Task[None]] = set()

    async def output(self, call_id: str, text: str) -> str | None:
        """Show ``text`` in the call's terminal (opened on its first output); its terminal id, or
        None where none could be opened (the output is then shown as text)."""
        if call_id in self._ended:
            return None
        mirror = self.open.get(call_id) or await self._open(call_id)
        if mirror is None:
            return None
        room = MAX_MIRRORED_CHARS - mirror.written
        if room > 0:
            shown = terminal_safe(text[:room], workflow_commands=False)
            if len(text) > room:
                shown += "\n[... more output, not shown here ...]\n"
            with mirror.out.open("a", encoding="utf-8", errors="replace") as f:
                f.write(shown)
        mirror.written += len(text)
        return mirror.terminal_id

    async def _open(self, call_id: str) -> Mirror | None:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="clover-acp-terminals-"))
        self._made += 1
        out, done = self.folder / f"{self._made}.out", self.folder / f"{self._made}.exit"
        out.write_bytes(b"")
        try:
            created = await self.conn.create_terminal(
                session_id=self.session_id,
                command=sys.executable,
                args=["-c", FOLLOWER, str(out), str(done)],
                cwd=str(self.cwd),
                env=[],
                output_byte_limit=OUTPUT_BYTE_LIMIT,
            )
        except Exception as exc:  # the client could not: the output is shown as text
            log.warning("terminal/create failed: %s", exc)
            self._ended.add(call_id)  # not asked again for this call
            return None
        mirror = self.open[call_id] = Mirror(created.terminal_id, out, done)
        task = asyncio.get_running_loop().create_task(self._watch(call_id, mirror))
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)
        return mirror

    async def _watch(self, call_id: str, mirror: Mirror) -> None:
        """Tell ``on_stopped`` when the terminal ends while its call still runs: the person stopped
        it in the editor, and the command in the sandbox is to stop too."""
        try:
            await self.conn.wait_for_terminal_exit(session_id=self.session_id, terminal_id=mirror.terminal_id)
        except Exception:  # released meanwhile, or the client went away
            return
        if self.open.get(call_id) is mirror and self.on_stopped is not None:
            self.on_stopped(call_id)

    async def end(self, call_id: str, exit_code: int | None, *, killed: bool = False) -> None:
        """The call ended: the follower shows the rest and exits with ``exit_code`` (killed: it is
        killed at once); the terminal is released either way."""
        mirror = self.open.pop(call_id, None)
        if mirror is None:
            return
        self._ended.add(call_id)
        mirror.done.write_text(str(exit_code if exit_code is not None else 1), encoding="utf-8")
        ids = {"session_id": self.session_id, "terminal_id": mirror.terminal_id}
        try:
            if killed:
                await self.conn.kill_terminal(**ids)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EXIT_WAIT_S):
                        await self.conn.wait_for_terminal_exit(**ids)
            await self.conn.release_terminal(**ids)
        except Exception as exc:
            log.warning("releasing terminal %s: %s", mirror.terminal_id, exc)

    async def close(self) -> None:
        for call_id in list(self.open):
            await self.end(call_id, None, killed=True)
        for task in list(self._watching):
            task.cancel()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
