"""Keeping the conversation inside the model's context window.

When the conversation nears the backend's window, the outputs of the oldest tool calls are replaced
by a one-line note first; if that is not enough, the oldest whole turns go. The system prompt, the
task and the most recent messages are pinned. What was dropped is said in a note message appended
to the conversation (and in the ``ContextCondensed`` event).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Condensation:
    messages: list[dict[str, Any]]
    note: str
    dropped: list[str]
    tokens_before: int
    tokens_after: int


@dataclass
class Condenser:
    """Keeps a conversation under ``threshold`` of the window, minus room for the reply."""

    context_window: int
    reply_tokens: int = 4096
    threshold: float = 0.9
    keep_recent: int = 4
    pinned_prefix: int = 2  # the system prompt and the task

    @property
    def limit(self) -> int:
        reply = min(self.reply_tokens, self.context_window // 4)
        return int(self.threshold * (self.context_window - reply))

    def condense(
        self,
        messages: list[dict[str, Any]],
        count: Callable[[list[dict[str, Any]]], int],
        tokens: int | None = None,
    ) -> Condensation | None:
        """A shorter conversation when ``messages`` is over the limit, else None. ``tokens`` is
        ``count(messages)`` when the caller has it already (counting renders the whole prompt)."""
        before = count(messages) if tokens is None else tokens
        if before <= self.limit:
            return None
        work = list(
            messages
        )  # a message changed is replaced, never changed in place (counts are kept by message)
        end = max(self.pinned_prefix, len(work) - self.keep_recent)
        dropped: list[str] = []
        tokens = before
        for i in range(self.pinned_prefix, end):
            if tokens <= self.limit:
                break
            message = work[i]
            if message.get("role") != "tool" or message.get("content", "").startswith(DROPPED_OUTPUT):
                continue
            what = describe_tool_message(work, i)
            work[i] = {
                **message,
                "content": f"{DROPPED_OUTPUT}: {what}, {len(message.get('content', ''))} characters]",
            }
            dropped.append(f"output of {what}")
            tokens = count(work)
        removed_turns = 0
        while tokens > self.limit:
            span = _oldest_turn(work, self.pinned_prefix, len(work) - self.keep_recent)
            if span is None:
                break
            start, stop = span
            dropped += [_describe_message(work, i) for i in range(start, stop)]
            del work[start:stop]
            removed_turns += 1
            tokens = count(work)
        if not dropped:
            return None
        outputs = sum(1 for d in dropped if d.startswith("output of "))
        parts = []
        if outputs:
            parts.append(f"the outputs of {outputs} earlier tool calls were replaced by short notes")
        if removed_turns:
            parts.append(f"{removed_turns} earlier turns were removed")
        listed = "; ".join(dropped[:20]) + (f"; … {len(dropped) - 20} more" if len(dropped) > 20 else "")
        note = (
            f"[Context note] To fit the model's context window ({self.context_window} tokens), "
            + " and ".join(parts)
            + f": {listed}. Call the tools again if you need any of it."
        )
        work.append({"role": "user", "content": note})
        return Condensation(work, note, dropped, before, count(work))


DROPPED_OUTPUT = "[output dropped to fit the context window"


def describe_tool_message(messages: list[dict[str, Any]], index: int) -> str:
    """`name args` of the call a tool message answers (looked up by ``tool_call_id``)."""
    call_id = messages[index].get("tool_call_id")
    for message in reversed(messages[:index]):
        for call in message.get("tool_calls") or ():
            if call.get("id") == call_id:
                function = call.get("function", {})
                return f"{function.get('name', '?')} {_short_args(function.get('arguments', {}))}"
    return messages[index].get("name") or "a tool call"


def _short_args(arguments: Any, limit: int = 80) -> str:
    if isinstance(arguments, dict):
        text = " ".join(
            f"{k}={v}" for k, v in arguments.items() if k in ("command", "path", "pattern", "target")
        )
    else:
        text = str(arguments)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe_message(messages: list[dict[str, Any]], index: int) -> str:
    message = messages[index]
    role = message.get("role")
    if role == "tool":
        return f"turn: result of {describe_tool_message(messages, index)}"
    if role == "assistant" and message.get("tool_calls"):
        names = ", ".join(c.get("function", {}).get("name", "?") for c in message["tool_calls"])
        return f"turn: assistant calling {names}"
    return f"turn: {role} message"


def _oldest_turn(messages: list[dict[str, Any]], start: int, stop: int) -> tuple[int, int] | None:
    """The oldest removable span: an assistant message with everything that answers it (tool
    results, format-error feedback, nudges) up to the next assistant message, or a lone message."""
    if start >= stop:
        return None
    end = start + 1
    if messages[start].get("role") == "assistant":
        while end < len(messages) and messages[end].get("role") != "assistant":
            end += 1
    if end > stop:  # the span reaches into the pinned recent messages
        return None
    return start, end
