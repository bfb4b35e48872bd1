"""Reasoning and answer: the model reasons inside ``<think>…</think>`` (the generation prompt usually
opens the ``<think>``), then answers. Whole texts are split by :func:`split_thinking`, streamed text
by :class:`ThinkingSplitter`."""

from __future__ import annotations

from typing import Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def split_thinking(text: str) -> tuple[str | None, str]:
    """``(reasoning, rest)``. Reasoning ends at the first ``</think>`` (the prompt usually opened the
    ``<think>``); a ``<think>`` never closed makes the whole text reasoning; no tags: no reasoning."""
    head, closed, tail = text.partition(THINK_CLOSE)
    if closed:
        reasoning = head.lstrip().removeprefix(THINK_OPEN)
        return reasoning.strip(), tail.lstrip("\n")
    if text.lstrip().startswith(THINK_OPEN):
        return text.lstrip().removeprefix(THINK_OPEN).strip(), ""
    return None, text


class ThinkingSplitter:
    """Splits streamed text into ``("reasoning", piece)`` until ``</think>`` and ``("text", piece)``
    after it, whatever the piece boundaries (a partly written ``</think>`` is held back). ``thinking``:
    the prompt opened ``<think>``, so the text starts as reasoning."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.pending = ""
        self.answer_started = not thinking  # the newlines after </think> are not part of the answer

    def feed(self, text: str) -> list[tuple[Literal["reasoning", "text"], str]]:
        if not self.thinking:
            return self._answer(text)
        self.pending += text
        head, closed, tail = self.pending.partition(THINK_CLOSE)
        if closed:
            self.thinking = False
            self.pending = ""
            return [("reasoning", head), *self._answer(tail)] if head else self._answer(tail)
        # hold back what could be the start of "</think>"
        keep = next(
            (n for n in range(len(THINK_CLOSE) - 1, 0, -1) if self.pending.endswith(THINK_CLOSE[:n])), 0
        )
        ready, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        return [("reasoning", ready)] if ready else []

    def flush(self) -> list[tuple[Literal["reasoning", "text"], str]]:
        """What is held back, at the end of the stream."""
        held, self.pending = self.pending, ""
        return [("reasoning", held)] if held else []

    def _answer(self, text: str) -> list[tuple[Literal["reasoning", "text"], str]]:
        if not self.answer_started:
            text = text.lstrip("\n")
            self.answer_started = bool(text)
        return [("text", text)] if text else []
