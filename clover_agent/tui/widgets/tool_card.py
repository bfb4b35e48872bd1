"""A tool call in the transcript: what was called, with what, and how it ended.

The header names the tool and its main argument; the status line gives the outcome, the duration
and the exit code where there is one. While a command runs, the body shows the last lines of what
it printed so far (:meth:`ToolCard.stream`); then it depends on the tool: an edit shows its diff
(highlighted), a test run a small table, anything else its output (an interrupted command's: what
it printed until then). Long bodies are folded to their first lines; ``enter`` on a focused card
(or ``ctrl+o`` in the app, for the newest folded card) shows all of it.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Static

from clover_agent.events import ToolCallFinished
from clover_agent.tui.widgets.diff_view import DiffView
from clover_agent.tui.widgets.results_table import TestTable

FOLDED_LINES = 8
#: Characters of a running command's output the card holds to show its last lines.
LIVE_TAIL_CHARS = 16 * 1024


def summarize(name: str, arguments: dict[str, Any], width: int = 70) -> str:
    """The call in one line: its command and main argument."""
    if name == "editor":
        text = f"{arguments.get('command', '?')} {arguments.get('path', '')}"
    elif name == "shell":
        text = str(arguments.get("command", ""))
    elif name == "run_tests":
        text = str(arguments.get("target") or "all tests")
    elif name == "search":
        text = " ".join(str(arguments[k]) for k in ("pattern", "path", "glob") if arguments.get(k))
    elif name == "finish":
        text = str(arguments.get("summary", ""))
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class ToolCard(Vertical, can_focus=True):
    """One call; :meth:`finish` fills in its result. Classes: ``-running``, ``-error``, ``-ok``,
    ``-waiting`` (for the person's approval), ``-interrupted``."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter,o", "toggle_fold", "Expand / fold", show=False)]
    DEFAULT_CSS = """
    ToolCard { height: auto; margin: 0 0 0 1; padding: 0 1; border-left: wide $primary 60%; }
    ToolCard:focus { border-left: wide $accent; background: $boost; }
    ToolCard.-error { border-left: wide $error; }
    ToolCard.-waiting { border-left: wide $warning; }
    ToolCard .card-head { text-style: bold; }
    ToolCard .card-status { color: $text-muted; }
    ToolCard.-error .card-status { color: $error; }
    ToolCard .card-output { color: $text-muted; }
    """

    def __init__(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        super().__init__(classes="-running")
        self.call_id = call_id
        self.tool = name
        self.arguments = arguments
        self.result: ToolCallFinished | None = None
        self.folded = True
        self.foldable = False
        self.decision = ""  # e.g. "allowed by user"
        self.was_interrupted = False  # Esc stopped it (CallInterrupted)
        self._before_tests: dict[str, str] | None = None
        self._head = Static(
            Text.assemble((f"▸ {name} ", "bold"), summarize(name, arguments)), classes="card-head"
        )
        self._status = Static("running…", classes="card-status", markup=False)
        self._body = Vertical()
        self._body.styles.height = "auto"
        self.live = ""  # the tail of what the running command printed so far (already printable)
        self._live: Static | None = None

    def compose(self) -> ComposeResult:
        yield self._head
        yield self._status
        yield self._body

    def note(self, text: str, css_class: str | None = None) -> None:
        """Show ``text`` as the card's status (e.g. waiting for approval)."""
        self._status.update(text)
        if css_class:
            self.set_class(True, css_class)

    def interrupted(self) -> None:
        """The person interrupted this call (Esc): its processes were stopped."""
        self.was_interrupted = True
        self.note("interrupted", "-error")

    async def stream(self, text: str) -> None:
        """More of what the running call printed (text made printable by the app): its last
        :data:`FOLDED_LINES` lines are shown until the result comes."""
        if self.result is not None or not text:
            return
        self.live = (self.live + text)[-LIVE_TAIL_CHARS:]
        shown = "\n".join(self.live.rstrip("\n").splitlines()[-FOLDED_LINES:])
        if self._live is None:
            self._live = Static(shown, markup=False, classes="card-output card-live")
            await self._body.mount(self._live)
        else:
            self._live.update(shown)

    def decided(self, approved: bool, by: str, feedback: str = "") -> None:
        """The policy's or the person's decision on this call (with what they said to do instead);
        it stays in the status line."""
        self.decision = f"{'allowed' if approved else 'denied'} by {by}"
        if feedback:
            self.decision += f": “{feedback}”"
        self.note(self.decision, None if approved else "-error")

    async def finish(self, result: ToolCallFinished, before_tests: dict[str, str] | None = None) -> None:
        self.result = result
        self.remove_class("-running", "-waiting")
        data = result.data or {}
        failing = [t for t, o in (before_tests or {}).items() if o in ("failed", "error")]
        if self.tool == "finish" and not result.is_error and failing:
            # the agent's summary is a claim: the tests it last ran disagree, and the card says so
            shown = ", ".join(failing[:3]) + (f" and {len(failing) - 3} more" if len(failing) > 3 else "")
            self.add_class("-error")
            self._status.update(
                f"! the agent's summary; {len(failing)} test(s) failed when last run: {shown}"
            )
            await self._show_body()
            return
        self.add_class("-error" if result.is_error else "-ok")
        outcome = "✗ interrupted" if self.was_interrupted else "✗ failed" if result.is_error else "✓ done"
        if self.tool == "finish" and not result.is_error:
            outcome = "the agent's summary (/apply checks it)"
        parts = [outcome, f"{result.duration_s:.1f} s"]
        if self.decision:
            parts.insert(1, self.decision)
        if data.get("exit_code") is not None:
            parts.append(f"exit {data['exit_code']}")
        elif data.get("timed_out"):
            parts.append("timed out")
        self._status.update(" · ".join(parts))
        self._before_tests = before_tests
        await self._show_body()

    def _lines(self) -> list[str]:
        assert self.result is not None
        return (self.result.full_output or self.result.output).rstrip().splitlines()

    async def _show_body(self) -> None:
        assert self.result is not None
        data = self.result.data or {}
        self._live = None
        await self._body.remove_children()
        if self.tool == "editor" and data.get("diff"):
            lines = data["diff"].count("\n")
            self.foldable = lines > FOLDED_LINES
            await self._body.mount(DiffView(data["diff"], max_lines=FOLDED_LINES if self.folded else None))
            if self.result.is_error:
                await self._body.mount(Static(self.result.output, markup=False, classes="card-output"))
            return
        if self.tool == "run_tests" and isinstance(data.get("report"), dict):
            await self._body.mount(TestTable(data["report"], self._before_tests))
            return
        if self.tool == "finish":
            return
        lines = self._lines()
        self.foldable = len(lines) > FOLDED_LINES
        shown = lines[:FOLDED_LINES] if self.folded and self.foldable else lines
        text = "\n".join(shown)
        if self.folded and self.foldable:
            text += f"\n… {len(lines) - FOLDED_LINES} more lines (enter / ctrl+o to expand)"
        if text.strip():
            await self._body.mount(Static(text, markup=False, classes="card-output"))

    async def action_toggle_fold(self) -> None:
        if self.result is None or not self.foldable:
            return
        self.folded = not self.folded
        await self._show_body()
