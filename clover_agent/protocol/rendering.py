"""Tool calls written back as text, the way the model writes them and the chat template renders them.

Prompts themselves are rendered by the model's chat template on the backend side
(:func:`clover_agent.backends.engine.render_prompt`); the protocol never needs the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from clover_agent.protocol.messages import FUNCTION_CLOSE, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall
from clover_agent.protocol.thinking import THINK_CLOSE, THINK_OPEN


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as the model writes it (and the chat template renders it): strings verbatim, other
    values as JSON. :func:`clover_agent.protocol.parse_tool_calls` reads it back to the same call
    (see docs/tool-call-parsing.md for the one shape of value for which that cannot hold)."""
    lines = [TOOL_CALL_OPEN, f"<function={name}>"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines += [f"<parameter={key}>", text, "</parameter>"]
    lines += [FUNCTION_CLOSE, TOOL_CALL_CLOSE]
    return "\n".join(lines)


def format_assistant_text(content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
    """The raw assistant text for a turn whose parts arrived separately (an OpenAI-style server):
    what a replay file stores and :func:`clover_agent.protocol.parse_assistant` reads back."""
    parts = [f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n\n" if reasoning else "", content.strip()]
    if calls:
        parts.append(
            ("\n\n" if content.strip() else "")
            + "\n".join(format_tool_call(c.name, c.arguments) for c in calls)
        )
    return "".join(parts)
