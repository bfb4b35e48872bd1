"""The model's text as OpenAI's chat-completions answer: reasoning (before ``</think>``) as
``reasoning_content``, Qwen3.6 calls to the tools offered as ``tool_calls`` (ids, arguments as JSON
strings; a call to any other tool stays text in the content), stop strings cutting the text.
:class:`AnswerStream` takes the committed text block by block and hands out deltas; a whole answer
is the same deltas joined (:meth:`AnswerStream.message`), so streamed and whole answers never
differ. Calls are read by the lenient scanner (docs/tool-call-parsing.md) and stream as they are
written: a call starts once the scanner's reading of it can change no more (it can only still be
cut off), its arguments go out a parameter at a time. docs/backends.md ("The answer") has the rules."""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from clover_agent.protocol import (
    FUNCTION_OPEN,
    TOOL_CALL_OPEN,
    BrokenBlock,
    ScannedCall,
    ThinkingSplitter,
    read_value,
    scan_progress,
    tool_parameters,
)
from clover_agent.protocol.messages import new_call_id

#: Where a call can start: one with its wrapper, or one whose wrapper the model left out.
CALL_MARKERS = (TOOL_CALL_OPEN, FUNCTION_OPEN)

#: Unsettled text (characters) scanned again at every new tag; a longer stretch, once it grew by an eighth.
RESCAN_FREELY = 8192

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


@dataclass
class StreamedCall:
    """A call as it went out: ``start`` (where its text starts in the content), ``fragments`` (its
    arguments as sent, joined: the JSON object), ``given`` (parameters sent), ``done`` (closed)."""

    start: int
    name: str
    id: str = field(default_factory=new_call_id)
    fragments: list[str] = field(default_factory=list)
    given: int = 0
    done: bool = False

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)

    def entry(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI writes it (in a delta, with its ``index``)."""
        entry: dict[str, Any] = {} if index is None else {"index": index}
        entry.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        return entry


class AnswerStream:
    """One answer being written. ``thinking``: the prompt opened ``<think>``; ``tools``: the tools
    offered (none: the text is all content, nothing is parsed).

    With tools, the content goes out up to where a call could start; then the text is scanned (up to
    its last newline, so no tag reads differently later) and what the scanner can no longer change
    goes out: plain text, calls to tools not offered (as text), and calls to the tools offered. A
    call to an offered tool starts (a delta with its index, id, name and ``""`` arguments) once its
    first parameter's tag follows its ``<function=NAME>``; each parameter goes out (``{"p": value``,
    then ``, "q": value``) once the next parameter's tag is written; ``}`` when the call is closed.
    The only way a started call can still fail the scanner is that the answer ends before its
    ``</function>`` (the token limit, a stop string, an end token): it is then left as sent, its
    arguments a JSON object never closed (no client can run it), and the finish reason is not
    ``tool_calls``. A call written without ``<tool_call>`` goes out whole once the scanner is sure
    of it. Blank text goes out only before more text, or at the end of an answer without calls."""

    def __init__(
        self,
        tools: list[dict[str, Any]],
        *,
        thinking: bool,
        stop: tuple[str, ...] = (),
        one_call: bool = False,
    ) -> None:
        self.tools = tools
        #: ``parallel_tool_calls: false``: the answer ends with its first call (what follows is dropped).
        self.one_call = one_call
        self.parameters = tool_parameters(tools)
        self.stop = StopStrings(stop)
        self.splitter = ThinkingSplitter(thinking)
        self.reasoning = ""
        self.content = ""
        self.calls: list[StreamedCall] = []
        self.deltas: list[dict[str, Any]] = []
        self._settled = 0  # characters of ``content`` the scanner can no longer change
        self._handled = 0  # characters of ``content`` sent, held as blank text, or taken into calls
        self._blank = ""  # blank text held back: it goes out only before more text
        self._scanned = 0  # how much of ``content`` the last scan read
        self.scan_work = 0  # characters scanned, all scans together

    @property
    def stopped(self) -> bool:
        """A stop string was written, or the one call allowed is closed: the answer is complete,
        decoding can stop."""
        return self.stop.hit or self.call_limit_hit

    @property
    def call_limit_hit(self) -> bool:
        """``one_call`` and the first call is closed."""
        return self.one_call and bool(self.calls) and self.calls[0].done

    @property
    def cut_off(self) -> bool:
        """A call started and the answer ended before its ``</function>``."""
        return any(not c.done for c in self.calls)

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas (``reasoning_content``, ``content`` or ``tool_calls``) for newly committed text."""
        if self.call_limit_hit:
            return []
        return self._route(self.splitter.feed(self.stop.feed(text)), final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The last deltas: held-back text and calls."""
        if self.call_limit_hit:
            return []
        out = self._route(self.splitter.feed(self.stop.flush()), final=False)
        if self.call_limit_hit:
            return out
        return out + self._route(self.splitter.flush(), final=True)

    def finish_reason(self, engine_reason: str | None) -> OpenAIFinish:
        """``length`` when the answer was cut, not finished (the token limit, or the engine's loop
        stop), calls or not: the calls read from it may be cut too; else ``tool_calls`` when there
        are calls, none cut off; else ``stop`` (a stop token or string)."""
        if not (self.stopped or engine_reason == "stop"):
            return "length"
        return "tool_calls" if self.calls and not self.cut_off else "stop"

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
            message["tool_calls"] = [c.entry() for c in self.calls]
        return message

    def _route(
        self, pieces: list[tuple[Literal["reasoning", "text"], str]], *, final: bool
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, piece in pieces:
            if kind == "reasoning":
                self.reasoning += piece
                out.append({"reasoning_content": piece})
            else:
                self.content += piece
        if not self.tools:
            if len(self.content) > self._handled:
                out.append({"content": self.content[self._handled :]})
                self._handled = len(self.content)
        else:
            self._scan(out, final)
        self.deltas += out
        return out

    # -- with tools ---------------------------------------------------------------------------------

    def _scan(self, out: list[dict[str, Any]], final: bool) -> None:
        """Send what the scanner can no longer change (at the end: all of it)."""
        text = self.content if final else self.content[: self.content.rfind("\n") + 1]
        # Without a new tag, nothing the scanner decided can change (the same tags, read the same).
        # A long unsettled stretch is scanned again only once it grew by an eighth: its scans then
        # cost a few times its length in all, not its length for every block.
        grown = len(text) - self._scanned
        if final or (
            "<" in self.content[self._scanned : len(text)]
            and (grown * 8 >= len(text) - self._settled or len(text) - self._settled <= RESCAN_FREELY)
        ):
            self._scanned = len(text)
            base = self._settled
            self.scan_work += len(text) - base
            progress = scan_progress(text[base:], self.parameters)
            pos = base
            for item in progress.items if final else progress.items[: progress.settled]:
                if not self._item(out, pos, item):
                    return  # a started call, cut off: the rest of the text is that block
                pos += len(item if isinstance(item, str) else item.text)
                if self.call_limit_hit:  # the one call allowed is closed: the answer ends with it
                    self._settled = pos
                    return
            self._settled = pos
            opened = progress.open_call
            if not final and opened is not None and opened.name in self.parameters:
                self._text(out, base + opened.start)
                self._call(out, base + opened.start, opened.name, opened.arguments, done=False)
        if final:  # blank text at the end is content only in an answer without calls
            if self._blank and not self.calls:
                out.append({"content": self._blank})
            return
        if self.calls and not self.calls[-1].done:
            return  # a call is being written: what follows it waits for its end
        # Text before the next place a call could start is plain text, whatever follows it.
        rest = self.content[self._settled :]
        starts = [i for i in (rest.find(m) for m in CALL_MARKERS) if i >= 0]
        upto = min(starts) if starts else len(rest) - _partial_suffix(rest, CALL_MARKERS)
        self._text(out, self._settled + upto)

    def _item(self, out: list[dict[str, Any]], pos: int, item: str | ScannedCall | BrokenBlock) -> bool:
        """Send one item the scanner settled at ``pos``; False: it is the end of a cut-off call."""
        started = self.calls[-1] if self.calls and not self.calls[-1].done else None
        if started is not None and started.start == pos:
            if not isinstance(item, ScannedCall):
                return False
            self._call(out, pos, item.name, item.arguments, done=True)
            self._handled = pos + len(item.text)
        elif isinstance(item, str):
            self._text(out, pos + len(item))
        elif isinstance(item, ScannedCall) and item.name in self.parameters:
            self._text(out, pos)
            self._call(out, pos, item.name, item.arguments, done=True)
            self._handled = pos + len(item.text)
        elif isinstance(item, ScannedCall) or item.in_content:
            self._text(out, pos + len(item.text))  # a call to a tool not offered: the text as written
        else:
            self._handled = pos + len(item.text)  # a broken block: dropped, as the scanner's reader does
        return True

    def _text(self, out: list[dict[str, Any]], upto: int) -> None:
        """Send the content up to ``upto``; blank text goes out only once text follows it."""
        if upto <= self._handled:
            return
        piece = self._blank + self.content[self._handled : upto]
        self._handled = upto
        body = piece.rstrip()
        self._blank = piece[len(body) :]
        if body:
            out.append({"content": body})

    def _call(
        self,
        out: list[dict[str, Any]],
        pos: int,
        name: str,
        arguments: tuple[tuple[str, str], ...],
        *,
        done: bool,
    ) -> None:
        """Send what is new of the call at ``pos``: its start, its parameters, its end."""
        if not self.calls or self.calls[-1].start != pos:
            self.calls.append(StreamedCall(pos, name))
            entry = self.calls[-1].entry(len(self.calls) - 1)
            out.append({"tool_calls": [entry]})
        call, index = self.calls[-1], len(self.calls) - 1
        properties = (self.parameters.get(name) or {}).get("properties")
        if not isinstance(properties, Mapping):
            properties = {}
        for key, raw in arguments[call.given :]:
            value = read_value(raw, properties.get(key))[0]
            pair = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
            self._fragment(out, call, index, ("{" if call.given == 0 else ", ") + pair)
            call.given += 1
        if done:
            self._fragment(out, call, index, "}" if call.given else "{}")
            call.done = True

    @staticmethod
    def _fragment(out: list[dict[str, Any]], call: StreamedCall, index: int, fragment: str) -> None:
        call.fragments.append(fragment)
        out.append({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


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
