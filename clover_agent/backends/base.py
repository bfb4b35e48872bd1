"""What every model backend is: the :class:`ModelBackend` interface, its result and its events.

A backend turns a conversation (OpenAI-style message dicts, see ``clover_agent.protocol``) and the
tool specs into one assistant turn. It never runs tools and keeps no conversation state of its own,
so the agent loop can resume from a trajectory with any backend.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from clover_agent.errors import CloverError, ExitCode, ModelUnavailable
from clover_agent.protocol import ToolCall, ToolCallFormatError, parse_assistant

#: Characters per token for estimates where no tokenizer is at hand (Qwen's BPE on code and English).
CHARS_PER_TOKEN = 3.5


def estimate_tokens(text: str) -> int:
    """A token count estimate for text with no tokenizer at hand (rounded up)."""
    return int(-(-len(text) // CHARS_PER_TOKEN))


class BackendUnavailable(ModelUnavailable):
    """The backend cannot serve: the server is unreachable, or the engine cannot load (exit 3)."""


class ReplayExhausted(CloverError):
    """A replay file has no turn left for the agent's next model call (exit 7)."""

    exit_code = ExitCode.AGENT_ERROR


class ContextOverflow(CloverError):
    """The prompt does not fit the model's context window. The agent loop condenses the
    conversation harder once and asks again; when it still does not fit, the run stops (exit 7)."""

    exit_code = ExitCode.AGENT_ERROR

    def __init__(self, prompt_tokens: int, context_window: int) -> None:
        super().__init__(
            f"The prompt has {prompt_tokens} tokens, more than the model's context window "
            f"({context_window} tokens leave no room for an answer)."
        )
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window


class PromptEstimate:
    """Estimated prompt sizes (:func:`estimate_tokens` of each message's JSON and the tools'), kept
    per message: the agent's conversation grows by appending, and condensing or a resumption makes
    new message objects, so a message seen before (the same object, never changed in place) is not
    measured again."""

    def __init__(self) -> None:
        self._tools: tuple[list[dict[str, Any]], int] | None = None
        self._seen: list[tuple[dict[str, Any], int]] = []  # (message, tokens so far through it)

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        if self._tools is None or self._tools[0] is not tools:
            self._tools = (tools, estimate_tokens(json.dumps(tools, ensure_ascii=False)))
        same = 0
        while same < min(len(self._seen), len(messages)) and self._seen[same][0] is messages[same]:
            same += 1
        del self._seen[same:]
        total = self._seen[-1][1] if self._seen else 0
        for message in messages[same:]:
            total += estimate_tokens(json.dumps(message, ensure_ascii=False))
            self._seen.append((message, total))
        return total + self._tools[1]


FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass
class ModelTurn:
    """One assistant turn as the agent loop consumes it.

    ``content`` is the visible text with the tool calls taken out. When the text held a malformed
    call, ``format_error`` is the message for the model, ``tool_calls`` is empty and ``content`` is
    the whole text after the reasoning (the broken call included) so the model sees what it wrote.
    """

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    raw: str  # the raw assistant text, as a replay file or a trajectory stores it
    format_error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: FinishReason = "stop"
    forwards: int = 0  # model forward passes it took (the engine counts them; 0: not known)

    @classmethod
    def from_text(
        cls,
        text: str,
        tools: list[dict[str, Any]],
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        finish_reason: FinishReason | None = None,
        forwards: int = 0,
    ) -> ModelTurn:
        """Parse a raw assistant text strictly; a malformed call becomes ``format_error``.
        ``finish_reason`` defaults to "tool_calls" when there are calls, else "stop"."""
        try:
            parsed = parse_assistant(text, tools)
        except ToolCallFormatError as error:
            return cls(
                content=error.content,
                reasoning=error.reasoning,
                tool_calls=[],
                raw=text,
                format_error=str(error),
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                finish_reason=finish_reason or "stop",
                forwards=forwards,
            )
        return cls(
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            raw=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish_reason or ("tool_calls" if parsed.tool_calls else "stop"),
            forwards=forwards,
        )

    def to_message(self) -> dict[str, Any]:
        """The turn as an assistant message for the next request (what the chat template renders)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message


@dataclass(frozen=True)
class BlockView:
    """The block-diffusion block being denoised, after one pass (engine backend only; nothing here
    is final). ``block``: index of the block in this model call; ``position``: absolute position of
    its first slot; ``denoise_step``: passes over this block so far; ``token_ids`` / ``filled`` per
    slot (undecided slots hold the mask token); ``newly_filled``: slots decided by this pass;
    ``text``: the text of the decided slots, in order."""

    block: int
    position: int
    denoise_step: int
    token_ids: list[int]
    filled: list[bool]
    newly_filled: list[int]
    text: str


@dataclass
class BackendEvent:
    """Streamed while the model writes: committed text, reasoning text, or (engine only) the state of
    the block being denoised (``block``)."""

    kind: Literal["text", "reasoning", "block"]
    text: str = ""
    block: BlockView | None = field(default=None)


EventCallback = Callable[[BackendEvent], None]


class ModelBackend(abc.ABC):
    """A source of assistant turns. Subclasses set ``name`` (shown to the user) and
    ``context_window`` (tokens)."""

    name: str
    context_window: int

    @abc.abstractmethod
    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_event: EventCallback | None = None,
    ) -> ModelTurn:
        """The next assistant turn for ``messages``; ``on_event`` sees the text as it is written."""

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        """Prompt size in tokens. This default estimates it from the characters of the messages and
        tools, for backends with no tokenizer at hand (one that has the tokenizer counts exactly);
        a conversation that grew by appending since the last count costs only its new messages."""
        counter: PromptEstimate | None = getattr(self, "_estimates", None)
        if counter is None:  # made on first use: subclasses need not call an __init__ here
            counter = self._estimates = PromptEstimate()
        return counter.count(messages, tools)

    async def check(self) -> None:
        """Raise :class:`BackendUnavailable` when the backend cannot serve, within seconds and
        before any work is done for it (a server that cannot be reached). This default checks
        nothing: a replay file is checked when it is read, the engine's readiness by
        ``clover_agent.launch.check_backend_options``."""
        return None

    async def close(self) -> None:
        """Release what the backend holds (connections, the model). Safe to call twice."""
        return None
