"""What the protocol hands out: the tags of the format, a tool call, a parsed assistant turn, and the
format error whose message is written for the model."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

#: What a format error shows the model.
FORMAT_REMINDER = (
    "Use exactly this format, one block per call, after any text:\n"
    "<tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n"
    "</function>\n</tool_call>"
)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    """One call the model asked for. ``arguments`` are already converted by the tool's schema."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI-style ``tool_calls`` entry (arguments as a dict, as the chat template wants)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class AssistantTurn:
    """An assistant text split into its parts."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]


class ToolCallFormatError(Exception):
    """The assistant text holds a tool call that cannot be run. ``str(error)`` is the message for the
    model; ``problems`` lists each issue; ``content`` is the text after the reasoning, unparsed."""

    def __init__(self, message: str, *, problems: list[str], content: str, reasoning: str | None) -> None:
        super().__init__(message)
        self.problems = problems
        self.content = content
        self.reasoning = reasoning


def format_error_message(problems: Sequence[str]) -> str:
    """The message a model gets back for unusable tool calls."""
    listed = "\n".join(f"- {p}" for p in problems)
    return f"Your tool call could not be used, so no tool was run:\n{listed}\n{FORMAT_REMINDER}\nWrite the call again."
