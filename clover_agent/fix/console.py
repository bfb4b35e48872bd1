"""The terminal side of a ``fix`` run: a plain-text view of its events, and approvals asked there.

Model text streams as it is written; tool calls are one line each; results are shown trimmed (the
trajectory keeps them whole). Provisional diffusion blocks are not drawn here (the TUI does).
:class:`TerminalApprover` answers the agent's approval requests (by call id, like any front end)
with what the person types.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, TextIO

from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.backends.threads import run_in_daemon_thread
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetWarning,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    ModelDelta,
    ModelResponded,
    SandboxProgress,
    TaskResumed,
    TaskStarted,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
)

TOOL_CALL_TAG = "<tool_call>"
RESULT_LINES = 8
RESULT_WIDTH = 160


class ConsoleRenderer:
    """Bus subscriber writing a concise log of the run to ``out`` (stdout by default)."""

    def __init__(self, out: TextIO | None = None, *, show_reasoning: bool = False) -> None:
        self.out = out or sys.stdout
        self.show_reasoning = show_reasoning
        self._kind = ""  # what is streaming now: "text" or "reasoning"
        self._turn_text = ""  # streamed so far of that kind, in the current model turn
        self._shown = 0  # how much of it was written
        self._text_streamed = False  # the turn's visible text came as deltas (do not repeat it)
        self._at_line_start = True

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelDelta):
            if event.kind == "text" or self.show_reasoning:
                if event.kind != self._kind:
                    self._end_line()
                    self._kind, self._turn_text, self._shown = event.kind, "", 0
                self._text_streamed |= event.kind == "text"
                self._stream(event.text)
        elif isinstance(event, ModelResponded):
            if not self._text_streamed and event.content.strip():
                self._line(event.content.strip())
            self._kind, self._turn_text, self._shown, self._text_streamed = "", "", 0, False
            self._end_line()
        elif isinstance(event, ToolCallStarted):
            self._line(f"→ {event.name} {_arguments(event.arguments)}")
        elif isinstance(event, ToolCallFinished):
            mark = "✗" if event.is_error else "✓"
            self._line(f"  {mark} {_trim(event.output)}")
        elif isinstance(event, ApprovalDecided):
            verdict = "allowed" if event.approved else "denied"
            self._line(f"  policy: {event.name} {verdict} by {event.decided_by} ({event.reason})")
        elif isinstance(event, ContextCondensed):
            self._line(
                f"  context: {event.tokens_before} → {event.tokens_after} tokens; {len(event.dropped)} dropped"
            )
        elif isinstance(event, BudgetWarning):
            self._line(f"  budget: {event.resource} at {event.used:g} of {event.limit:g}")
        elif isinstance(event, ErrorReported) and not event.fatal:
            self._line(f"  ! {event.kind}: {_trim(event.message, lines=2)}")
        elif isinstance(event, TaskStarted):
            target = repr(event.target) if event.target else "(the tests failing in the suite)"
            self._line(f"clover-agent {event.command} {target} in {event.repo} ({event.sandbox} sandbox)")
        elif isinstance(event, TaskResumed):
            code = "" if event.previous_exit_code is None else f", exit {event.previous_exit_code}"
            self._line(
                f"clover-agent {event.command} resumes run {event.run_id} (segment {event.segment}) in "
                f"{event.repo} ({event.sandbox} sandbox); it stopped: {event.previous_outcome}{code}: "
                f"{event.previous_message}"
            )
        elif isinstance(event, TestsRun):
            r = event.report
            what = f"tests {event.phase.replace('_', ' ')}"
            self._line(
                f"{what}: {r.get('passed', 0)} passed, {r.get('failed', 0)} failed, {r.get('errors', 0)} errors"
            )
        elif isinstance(event, SandboxProgress):
            self._line(f"sandbox: {event.message}")
        elif isinstance(event, Done):
            self._line(f"done ({event.outcome.replace('_', ' ')}): {event.summary or event.message}")
        self.out.flush()

    def _stream(self, text: str) -> None:
        """Write model text up to its first tool call (calls get their own line); a tag split
        across deltas is held back until it is complete."""
        self._turn_text += text
        cut = self._turn_text.find(TOOL_CALL_TAG)
        if cut < 0:
            cut = len(self._turn_text)
            for keep in range(len(TOOL_CALL_TAG) - 1, 0, -1):
                if self._turn_text.endswith(TOOL_CALL_TAG[:keep]):
                    cut -= keep
                    break
        visible = self._turn_text[: max(cut, self._shown)]
        if len(visible) > self._shown:
            chunk = visible[self._shown :]
            if self._shown == 0:
                chunk = chunk.lstrip("\n")
            self._write(chunk.rstrip("\n") if cut < len(self._turn_text) else chunk)
            self._shown = len(visible)

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self._at_line_start = text.endswith("\n")

    def _end_line(self) -> None:
        if not self._at_line_start:
            self.out.write("\n")
            self._at_line_start = True

    def _line(self, text: str) -> None:
        self._end_line()
        self.out.write(text + "\n")


def _arguments(arguments: dict[str, Any]) -> str:
    parts = []
    for key, value in arguments.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        shown = " ".join(str(shown).split())
        if len(shown) > 60:
            shown = shown[:59] + "…"
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def _trim(text: str, lines: int = RESULT_LINES) -> str:
    rows = text.strip().splitlines() or [""]
    shown = [r if len(r) <= RESULT_WIDTH else r[: RESULT_WIDTH - 1] + "…" for r in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"… {len(rows) - lines} more lines")
    return "\n    ".join(shown)


async def ask_at_terminal(name: str, arguments: dict[str, Any], reason: str) -> Answer:
    """Ask the person at the terminal about one call; end of input (Ctrl-D) is no."""
    shown = " ".join(f"{k}={v!r}" for k, v in arguments.items())
    question = (
        f"\nThe agent wants to run {name} {shown}\n({reason}). Allow? [y]es / [a]lways for this run / [N]o "
    )
    try:
        # A daemon thread: a run that ends (Ctrl-C) while the question waits does not wait for it.
        answer = await run_in_daemon_thread(lambda: input(question), name="clover-approval")
    except EOFError:
        return Answer.DENY
    answer = answer.strip().lower()
    if answer in ("a", "always"):
        return Answer.ALWAYS
    return Answer.ONCE if answer in ("y", "yes") else Answer.DENY


class TerminalApprover:
    """Bus subscriber: asks at the terminal about each ``ApprovalRequested`` and answers it through
    ``approvals`` by its call id. The question runs as its own task, so the bus never waits on it."""

    def __init__(self, approvals: Approvals) -> None:
        self.approvals = approvals
        self._asking: set[asyncio.Task[None]] = set()

    def __call__(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask(self, event: ApprovalRequested) -> None:
        self.approvals.answer(event.call_id, await ask_at_terminal(event.name, event.arguments, event.reason))
