"""The status line: backend, sandbox, step, context, budget left, policy, what was used, speed.

Everything is derived from the session's events and their own timestamps (never from a clock
read while drawing), so a redrawn or recorded session shows the same figures.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from clover_agent.agent.notes import INTERRUPTED_REPLY
from clover_agent.events import (
    CallInterrupted,
    Done,
    Event,
    MessageAdded,
    ModelDelta,
    ModelResponded,
    ProvisionalBlock,
    RunStarted,
    ToolCallFinished,
)
from clover_agent.session.events import Notice, SandboxState, SessionStarted, TurnStarted
from clover_agent.tui.usage import Usage
from clover_agent.tui.usage import short as _short

#: A model call shorter than this gives no rate: its tokens per second would mean nothing.
MIN_RATE_SECONDS = 0.5


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 else f"{int(seconds)}s"


class StatusBar(Static):
    """Observes events (:meth:`observe`) and draws one line."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__("")
        self.backend = "…"
        self.context_window = 0
        self.limits: dict[str, Any] = {}
        self.sandbox = "starting"
        self.sandbox_kind = ""
        self.policy = ""
        self.planning = False  # plan mode (its notices say when it starts and ends)
        self.step = 0
        self.turn_first_step = 1
        self.turn_started: float | None = None
        self.prompt_tokens = 0
        self.tokens_per_s: float | None = None
        self.tokens_per_forward: float | None = None
        self.busy = False
        self.waiting = False  # interrupted: the agent waits for the person's message
        self._call_started: float | None = None  # first streamed event of the model call going on
        self._passes = 0  # denoising passes in that call
        self._last_time = 0.0
        self.usage = Usage()

    def observe(self, event: Event) -> None:
        self._last_time = event.time
        self.usage.observe(event)
        if isinstance(event, SessionStarted):
            self.backend, self.sandbox_kind, self.policy = event.backend, event.sandbox, event.policy
            self.context_window = event.context_window
        elif isinstance(event, Notice) and "planning" in event.data:
            self.planning = bool(event.data["planning"])
        elif isinstance(event, SandboxState):
            self.sandbox, self.sandbox_kind = event.state, event.kind
        elif isinstance(event, RunStarted):
            self.limits = event.limits
            self.busy = True
            self._call_started = event.time
        elif isinstance(event, TurnStarted):
            self.turn_first_step, self.turn_started = event.first_step, event.time
        elif isinstance(event, ModelDelta | ProvisionalBlock):
            if self._call_started is None:
                self._call_started = event.time
            if isinstance(event, ProvisionalBlock):
                self._passes += 1
        elif isinstance(event, ModelResponded):
            self.step, self.prompt_tokens = event.step, event.prompt_tokens
            took = event.time - self._call_started if self._call_started is not None else 0.0
            if took >= MIN_RATE_SECONDS and not self.backend.startswith("replay"):
                self.tokens_per_s = event.completion_tokens / took
            else:  # a replay plays recorded turns, and a blink of a call has no meaningful rate
                self.tokens_per_s = None
            self.tokens_per_forward = event.completion_tokens / self._passes if self._passes else None
            self._call_started, self._passes = None, 0
        elif isinstance(event, ToolCallFinished):
            self._call_started = event.time  # the next model call starts about now
        elif isinstance(event, CallInterrupted):
            self.waiting = True
        elif isinstance(event, MessageAdded) and event.message.get("role") == "user":
            # the person's message, not the note an interrupted reply leaves for the model
            self.waiting = self.waiting and event.message.get("content") == INTERRUPTED_REPLY
        elif isinstance(event, Done):
            self.busy = self.waiting = False
            self._call_started = None
        self.refresh_line()

    def set_policy(self, name: str) -> None:
        self.policy = name
        self.refresh_line()

    def line(self) -> Text:
        """The line, most important first (a narrow terminal cuts the end)."""
        state_style = {"ready": "green", "failed": "red bold", "starting": "yellow"}.get(self.sandbox, "")
        parts: list[tuple[str, str]] = [
            (self.backend, "bold"),
            (f"{self.sandbox_kind or 'sandbox'} {self.sandbox}", state_style),
        ]
        if self.waiting:
            parts.append(("interrupted: waiting for you", "yellow bold"))
        max_steps = self.limits.get("max_steps")
        if self.busy and self.turn_started is not None:
            used = max(0, self.step - self.turn_first_step + 1)
            parts.append((f"step {used}/{max_steps}" if max_steps else f"step {used}", ""))
        else:
            parts.append((f"{self.step} steps", ""))
        window = f"/{_short(self.context_window)}" if self.context_window else ""
        parts.append((f"ctx {_short(self.prompt_tokens)}{window}", ""))
        max_time = self.limits.get("max_time_s")
        if self.busy and self.turn_started is not None:
            left = [f"{max(0, max_steps - used)} steps"] if max_steps else []
            if max_time:
                left.append(_duration(max(0.0, max_time - (self._last_time - self.turn_started))))
            if left:
                parts.append(("left " + " ".join(left), ""))
        if self.planning:  # read-only until a plan is approved; then the policy named
            parts.append((f"plan → {self.policy}", "bold magenta"))
        elif self.policy:  # what runs unasked: before the figures, which a narrow terminal cuts first
            parts.append((self.policy, ""))
        spent = self.usage.status()
        if spent:
            parts.append((spent, ""))
        speed = [] if self.tokens_per_s is None else [f"{self.tokens_per_s:.0f} tok/s"]
        if self.tokens_per_forward is not None:  # the denoising's yield: meaningful however short the call
            speed.append(f"{self.tokens_per_forward:.1f}/fwd")
        if speed:
            parts.append((" ".join(speed), ""))
        out = Text(no_wrap=True, overflow="ellipsis")
        for index, (text, style) in enumerate(parts):
            if index:
                out.append(" │ ", style="dim")
            out.append(text, style=style)
        return out

    def refresh_line(self) -> None:
        self.update(self.line())
