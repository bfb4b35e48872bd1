"""The model's text as OpenAI's chat-completions answer: reasoning (before ``</think>``) as
``reasoning_content``, Qwen3.6 calls to the tools offered as ``tool_calls`` (ids, arguments as JSON
strings; a call to any other tool stays text in the content), stop strings cutting the text.
:class:`AnswerStream` takes the committed text block by block and hands out deltas; a whole answer
is the same deltas joined (:meth:`AnswerStream.message`), so streamed and whole answers never
differ. Text from the first tool-call tag on is held back until the end, when the calls are parsed
(leniently, as the serving engines do: docs/tool-call-parsing.md)."""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from typing import Any, Literal

from clover_agent.protocol import FUNCTION_OPEN, TOOL_CALL_OPEN, ThinkingSplitter, ToolCall, parse_tool_calls

#: Where held-back text starts: a call with its wrapper, or one whose wrapper the model left out.
CALL_MARKERS = (TOOL_CALL_OPEN, FUNCTION_OPEN)

OpenAIFinish = Literal["stop", "length", "tool_calls"]


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could begin one of ``markers``."""
    longest = max((len(m) for m in markers), default=1) - 1
    for n in range(min(longest, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


class StopStrings:
    """Cuts streamed text at the first of ``stops``; text that could begin one is held back.
    ``end``: after a hit, where the stop string ended in all the text fed (characters)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""
        self.hit = False
        self.released = 0  # characters fed before ``pending``
        self.end = 0

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        if not self.stops:
            self.released += len(text)
            return text
        self.pending += text
        found = [(i, i + len(s)) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if found:
            start, end = min(found)  # the first to start; of those starting there, the shortest
            ready, self.pending, self.hit = self.pending[:start], "", True
            self.end = self.released + end
            return ready
        keep = _partial_suffix(self.pending, self.stops)
        ready, self.pending = (
            self.pending[: len(self.pending) - keep],
            self.pending[len(self.pending) - keep :],
        )
        self.released += len(ready)
        return ready

    def flush(self) -> str:
        held, self.pending = self.pending, ""
        return held


def tool_call_entry(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call as OpenAI writes it (in a delta, with its ``index``)."""
    entry: dict[str, Any] = {} if index is None else {"index": index}
    entry.update(
        id=call.id,
        type="function",
        function={"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    )
    return entry


class AnswerStream:
    """One answer being written. ``thinking``: the prompt opened ``<think>``; ``tools``: the tools
    offered (none: the text is all content, nothing is parsed)."""

    def __init__(self, tools: list[dict[str, Any]], *, thinking: bool, stop: tuple[str, ...] = ()) -> None:
        self.tools = tools
        self.stop = StopStrings(stop)
        self.splitter = ThinkingSplitter(thinking)
        self.reasoning = ""
        self.content = ""
        self.sent = 0  # characters of ``content`` handed out
        self.calls: list[ToolCall] = []
        self.final_content = ""
        self.deltas: list[dict[str, Any]] = []

    @property
    def stopped(self) -> bool:
        """A stop string was written: the answer is complete, decoding can stop."""
        return self.stop.hit

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas (``{"reasoning_content": ...}`` or ``{"content": ...}``) for newly committed text."""
        return self._route(self.splitter.feed(self.stop.feed(text)))

    def finish(self) -> list[dict[str, Any]]:
        """The last deltas: held-back text, then the tool calls."""
        out = self._route(self.splitter.feed(self.stop.flush()))
        out += self._route(self.splitter.flush())
        extra: list[dict[str, Any]] = []
        if self.tools:  # a call to a tool not offered stays text: no client runs what it did not offer
            self.final_content, self.calls = parse_tool_calls(self.content, self.tools, offered_only=True)
        else:
            self.final_content = self.content
        sent = self.content[: self.sent].lstrip()  # the parsed content is stripped
        rest = self.final_content[len(sent) :] if self.final_content.startswith(sent) else ""
        if rest.strip() or (rest and not self.calls):
            extra.append({"content": rest})
        if self.calls:
            extra.append({"tool_calls": [tool_call_entry(c, i) for i, c in enumerate(self.calls)]})
        self.deltas += extra
        return out + extra

    def finish_reason(self, engine_reason: str | None) -> OpenAIFinish:
        """``length`` when the answer was cut, not finished (the token limit, or the engine's loop
        stop), calls or not: the calls read from it may be cut too; else ``tool_calls`` when there
        are calls, ``stop`` at a stop token or string."""
        if not (self.stopped or engine_reason == "stop"):
            return "length"
        return "tool_calls" if self.calls else "stop"

    def message(self) -> dict[str, Any]:
        """The whole answer as an assistant message (after :meth:`finish`)."""
        reasoning = "".join(d.get("reasoning_content", "") for d in self.deltas).strip()
        content = "".join(d.get("content", "") for d in self.deltas)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content if content or not self.calls else None,
            "reasoning_content": reasoning or None,
        }
        if self.calls:
            message["tool_calls"] = [tool_call_entry(c) for c in self.calls]
        return message

    def _route(self, pieces: list[tuple[Literal["reasoning", "text"], str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, piece in pieces:
            if kind == "reasoning":
                self.reasoning += piece
                out.append({"reasoning_content": piece})
            else:
                self.content += piece
        ready = self._releasable()
        if ready > self.sent:
            out.append({"content": self.content[self.sent : ready]})
            self.sent = ready
        self.deltas += out
        return out

    def _releasable(self) -> int:
        """How much of ``content`` may go out now: all of it without tools, else up to the first
        call marker (or a partial one at the end)."""
        if not self.tools:
            return len(self.content)
        starts = [i for i in (self.content.find(m, max(0, self.sent - 16)) for m in CALL_MARKERS) if i >= 0]
        if starts:
            return max(self.sent, min(starts))
        return len(self.content) - _partial_suffix(self.content, CALL_MARKERS)


def tokens_through(decode: Callable[[list[int]], str], token_ids: list[int], chars: int) -> int:
    """How many of ``token_ids`` it takes to write the first ``chars`` characters of their text
    (``decode``: the tokenizer's); a token the boundary falls inside counts."""
    if chars <= 0:
        return 0

    def written(n: int) -> int:  # characters the first n tokens write (a cut character: not yet)
        return len(decode(token_ids[:n]).rstrip("\ufffd"))

    return min(bisect.bisect_left(range(len(token_ids) + 1), chars, key=written), len(token_ids))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_body(
    ident: str, created: int, model: str, message: dict[str, Any], finish: OpenAIFinish, used: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": used,
    }


def chunk_body(
    ident: str,
    created: int,
    model: str,
    delta: dict[str, Any] | None,
    finish: OpenAIFinish | None = None,
    used: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``: a delta (with its finish reason), or the usage chunk (no choices)."""
    body: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    body["choices"] = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    )
    if used is not None:
        body["usage"] = used
    return body
