"""What a session costs, from its events: tokens in and out, model calls and time, per request and
in all. The status bar shows the last request and the totals; ``/usage`` lists every request.

Tokens in are the prompt tokens of every model call (each call reads the whole conversation, as a
server bills it); tokens out are what the model wrote. A redrawn session counts its earlier
requests the same way, from their recorded events.
"""

from __future__ import annotations

from dataclasses import dataclass

from clover_agent.events import Done, Event, ModelResponded
from clover_agent.session.events import TurnStarted


@dataclass
class RequestUsage:
    """One request's share: from its ``TurnStarted`` to the ``Done`` that ended it."""

    turn: int
    started: float
    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    model_s: float = 0.0  # the model calls' own time
    ended: float | None = None

    @property
    def elapsed_s(self) -> float | None:
        return None if self.ended is None else max(0.0, self.ended - self.started)


def short(count: float) -> str:
    """A token count in a few characters: 950, 1.2k, 340k, 1.5M."""
    if count >= 1_000_000:
        return f"{count / 1_000_000:.1f}M"
    if count >= 100_000:
        return f"{count / 1000:.0f}k"
    if count >= 1000:
        return f"{count / 1000:.1f}k"
    return f"{int(count)}"


def seconds(value: float) -> str:
    return f"{int(value // 60)}m{int(value % 60):02d}s" if value >= 60 else f"{value:.0f}s"


class Usage:
    """Counts the session's events (:meth:`observe`); :attr:`requests` in order."""

    def __init__(self) -> None:
        self.requests: list[RequestUsage] = []
        # running totals: the status bar reads them on every event, streamed tokens included
        self.tokens_in = 0
        self.tokens_out = 0

    def observe(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            self.requests.append(RequestUsage(event.turn, event.time))
        elif isinstance(event, ModelResponded) and self.requests:
            last = self.requests[-1]
            last.calls += 1
            last.tokens_in += event.prompt_tokens
            last.tokens_out += event.completion_tokens
            last.model_s += event.seconds
            self.tokens_in += event.prompt_tokens
            self.tokens_out += event.completion_tokens
        elif isinstance(event, Done) and self.requests and self.requests[-1].ended is None:
            self.requests[-1].ended = event.time

    def status(self) -> str:
        """For the status bar: the last finished request's tokens and time, then the session's."""
        if not self.requests:
            return ""
        done = next((r for r in reversed(self.requests) if r.elapsed_s is not None), None)
        last = ""
        if done is not None:
            last = (
                f"last {short(done.tokens_in)}↑ {short(done.tokens_out)}↓ {seconds(done.elapsed_s or 0.0)} · "
            )
        return f"{last}total {short(self.tokens_in)}↑ {short(self.tokens_out)}↓"

    def lines(self) -> list[str]:
        """``/usage``: one line per request, then the totals."""
        if not self.requests:
            return ["No request yet: nothing used."]
        out = []
        for r in self.requests:
            took = "running" if r.elapsed_s is None else seconds(r.elapsed_s)
            out.append(
                f"request {r.turn}: {r.calls} model call(s), {r.tokens_in:,} tokens in, {r.tokens_out:,} out, "
                f"{took} (the model {seconds(r.model_s)})"
            )
        calls = sum(r.calls for r in self.requests)
        model_s = sum(r.model_s for r in self.requests)
        out.append(
            f"in all: {len(self.requests)} request(s), {calls} model call(s), {self.tokens_in:,} tokens in, "
            f"{self.tokens_out:,} out, the model {seconds(model_s)}"
        )
        return out
