"""The activity line above the prompt: a spinner, what the agent is doing, and for how long.

It shows only while a request runs, from the live events (a redrawn session never shows it): waiting
for the first token (with the prompt's size), thinking, writing, denoising block k, running a tool
(a shell call's command), waiting for an approval. The elapsed times are read from the clock
while drawing (four times a second), so the line says the app is alive even when no event comes.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from clover_agent.events import (
    CallInterrupted,
    Done,
    Event,
    ModelCallStarted,
    ModelDelta,
    ModelResponded,
    ProvisionalBlock,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.session.events import ApprovalNeeded, TurnStarted

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
COMMAND_CHARS = 60  # of a shell command, shown


def elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def doing(event: Event) -> str | None:
    """What the agent does from ``event`` on ("" : nothing to show; None: the same as before)."""
    if isinstance(event, TurnStarted):
        return "starting"
    if isinstance(event, ModelCallStarted):
        return f"waiting for the first token (a prompt of {event.prompt_tokens} tokens)"
    if isinstance(event, ModelDelta):
        return "thinking" if event.kind == "reasoning" else "writing"
    if isinstance(event, ProvisionalBlock):
        return f"denoising block {event.block} (pass {event.denoise_step})"
    if isinstance(event, ModelResponded | ToolCallFinished):
        return "going on"
    if isinstance(event, ToolCallStarted):
        command = event.arguments.get("command") if event.name == "shell" else None
        if isinstance(command, str) and command.strip():
            shown = " ".join(command.split())
            shown = shown if len(shown) <= COMMAND_CHARS else shown[: COMMAND_CHARS - 1] + "…"
            return f"running `{shown}`"
        return f"running {event.name}"
    if isinstance(event, ApprovalNeeded):
        return f"waiting for your approval of {event.name}"
    if isinstance(event, CallInterrupted | Done):
        return ""
    return None


class ActivityLine(Static):
    """See the module docstring; :meth:`observe` takes each live event."""

    DEFAULT_CSS = """
    ActivityLine { height: 1; padding: 0 1; color: $text-muted; display: none; }
    ActivityLine.-active { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.what = ""
        self.history: list[str] = []  # every state shown, in order (tests read it)
        self._since = 0.0  # when ``what`` began (monotonic)
        self._request_since = 0.0  # when the request began
        self._frame = 0
        #: Interrupted: the agent waits for the person, whatever the interrupted call reports as it
        #: ends, until the next model call.
        self._paused = False

    def on_mount(self) -> None:
        self.set_interval(0.25, self._tick)

    def observe(self, event: Event) -> None:
        if isinstance(event, CallInterrupted):
            self._paused = True
        elif isinstance(event, ModelCallStarted | TurnStarted | Done):
            self._paused = False
        elif self._paused:
            return  # the interrupted call ending, the checkpoint after it: nothing is being done
        what = doing(event)
        if what is None or what == self.what:
            return
        now = time.monotonic()
        if isinstance(event, TurnStarted) or not self.what:
            self._request_since = now
        self.what, self._since = what, now
        if what:
            self.history.append(what)
        self.set_class(bool(what), "-active")
        self.update(self.line(now))

    def line(self, now: float) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(FRAMES[self._frame % len(FRAMES)] + " ", style="bold")
        out.append(self.what)
        out.append(f" · {elapsed(now - self._since)}", style="dim")
        if self._since > self._request_since:
            out.append(f" (request {elapsed(now - self._request_since)})", style="dim")
        return out

    def _tick(self) -> None:
        if self.what:
            self._frame += 1
            self.update(self.line(time.monotonic()))
