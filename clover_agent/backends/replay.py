"""The replay backend: assistant turns read from a JSON Lines file, one per model call.

Each line is ``{"content": "<raw assistant text>"}``, exactly what the model would have written
(reasoning, text and tool calls in the Qwen3.6 format); each call returns the next line, parsed with
the protocol like a model's output. It drives tests and demos of the machinery and is never presented
as a model: its name says "replay".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def load_replay(path: Path) -> list[str]:
    """The assistant texts of a replay file; a bad line is a :class:`UsageError` naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read the replay file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not a UTF-8 text file (JSON Lines); byte {exc.start} is not UTF-8"
        ) from exc
    turns: list[str] = []
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
        turns.append(entry["content"])
    return turns


class ReplayBackend(ModelBackend):
    """Returns the turns of a replay file in order; running out raises :class:`ReplayExhausted`."""

    def __init__(self, path: str | Path, *, context_window: int = 131072) -> None:
        self.path = Path(path)
        self.turns = load_replay(self.path)
        self.used = 0
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
        text = self.turns[self.used]
        self.used += 1
        if on_event is not None:
            reasoning, rest = split_thinking(text)
            if reasoning:
                on_event(BackendEvent(kind="reasoning", text=reasoning))
            if rest:
                on_event(BackendEvent(kind="text", text=rest))
        return ModelTurn.from_text(
            text,
            tools,
            prompt_tokens=self.count_tokens(messages, tools),
            completion_tokens=estimate_tokens(text),
        )
