"""The replay backend: assistant turns read from a JSON Lines file, one per model call.

Each line is ``{"content": "<raw assistant text>"}``, exactly what the model would have written
(reasoning, text and tool calls in the Qwen3.6 format); each call returns the next line, parsed with
the protocol like a model's output. A line may add ``"seconds": S``: the turn is then streamed in
pieces over S seconds, as a model writes, for demos of a streaming front end and tests of what
happens while a model call is under way (an interrupt). It drives tests and demos of the machinery
and is never presented as a model: its name says "replay".
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clover_agent.backends.base import (
    BackendEvent,
    EventCallback,
    ModelBackend,
    ModelTurn,
    ReplayExhausted,
    estimate_tokens,
)
from clover_agent.errors import UsageError
from clover_agent.protocol import split_thinking

#: A paced turn is streamed in this many pieces at most.
PACED_PIECES = 20


@dataclass(frozen=True)
class ReplayTurn:
    text: str
    seconds: float = 0.0  # stream it over this long (0: all at once)


def load_replay(path: Path) -> list[ReplayTurn]:
    """The assistant turns of a replay file; a bad line is a :class:`UsageError` naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read the replay file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not a UTF-8 text file (JSON Lines); byte {exc.start} is not UTF-8"
        ) from exc
    turns: list[ReplayTurn] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise UsageError(
                f'{path}:{number}: each line must be an object {{"content": "<assistant text>"}}'
            )
        seconds = entry.get("seconds", 0)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
            raise UsageError(f"{path}:{number}: seconds must be a number of seconds, 0 or more")
        turns.append(ReplayTurn(entry["content"], float(seconds)))
    return turns


class ReplayBackend(ModelBackend):
    """Returns the turns of a replay file in order, from turn ``start`` (0: the first; a resumed run
    skips the turns its earlier segments used); running out raises :class:`ReplayExhausted`."""

    def __init__(self, path: str | Path, *, start: int = 0, context_window: int = 131072) -> None:
        self.path = Path(path)
        self.turns = load_replay(self.path)
        self.used = start
        self.name = f"replay:{self.path.name}"
        self.context_window = context_window

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_event: EventCallback | None = None,
    ) -> ModelTurn:
        if self.used >= len(self.turns):
            raise ReplayExhausted(
                f"the replay file {self.path} has no turn left: all {len(self.turns)} were used and the "
                "agent asked for another. Add lines to the file, or lower the step budget."
            )
        turn = self.turns[self.used]
        self.used += 1
        if on_event is not None or turn.seconds:
            await _stream(turn, on_event)
        return ModelTurn.from_text(
            turn.text,
            tools,
            prompt_tokens=self.count_tokens(messages, tools),
            completion_tokens=estimate_tokens(turn.text),
        )


async def _stream(turn: ReplayTurn, on_event: EventCallback | None) -> None:
    """The turn's reasoning, then its text, as events: at once, or in pieces over ``turn.seconds``
    (the first piece at once, then one after each pause)."""
    reasoning, rest = split_thinking(turn.text)
    parts: list[tuple[Literal["reasoning", "text"], str]] = [("reasoning", reasoning or ""), ("text", rest)]
    if not turn.seconds:
        pieces = [(kind, text) for kind, text in parts if text]
    else:
        size = max(1, -(-sum(len(text) for _, text in parts) // PACED_PIECES))
        pieces = [(kind, text[i : i + size]) for kind, text in parts for i in range(0, len(text), size)]
    pause = turn.seconds / max(1, len(pieces))
    for index, (kind, text) in enumerate(pieces):
        if index and pause:
            await asyncio.sleep(pause)
        if on_event is not None:
            on_event(BackendEvent(kind=kind, text=text))
    if pause:
        await asyncio.sleep(pause)
