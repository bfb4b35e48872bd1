"""A plain-text view of a run for the terminal (the ``fix`` command's renderer).

Model text streams as it is written; tool calls are one line each; results are shown trimmed (the
trajectory keeps them whole). Provisional diffusion blocks are not drawn here (the TUI does).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from clover_agent.events import (
    ApprovalDecided,
    BudgetWarning,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    ModelDelta,
    ModelResponded,
    ToolCallFinished,
    ToolCallStarted,
)

RESULT_LINES = 8
RESULT_WIDTH = 160


class ConsoleRenderer:
    """Bus subscriber writing a concise log of the run to ``out`` (stdout by default)."""

    def __init__(self, out: TextIO | None = None, *, show_reasoning: bool = False) -> None:
        self.out = out or sys.stdout
        self.show_reasoning = show_reasoning
        self._streamed = False  # text of the current model turn was already streamed
        self._at_line_start = True

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelDelta):
            if event.kind == "text" or self.show_reasoning:
                self._write(event.text)
                self._streamed = True
        elif isinstance(event, ModelResponded):
            if not self._streamed and event.content.strip():
                self._line(f"[{event.step}] {event.content.strip()}")
            self._streamed = False
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
        elif isinstance(event, Done):
            self._line(f"agent {event.outcome}: {event.summary or event.message}")
        self.out.flush()

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
