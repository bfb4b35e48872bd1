"""The Qwen3.6 chat format as the agent speaks it: reasoning, content and tool calls out of the
assistant's text, and calls written back as text.

One concept per module: :mod:`~clover_agent.protocol.messages` (tags, :class:`ToolCall`, the format
error), :mod:`~clover_agent.protocol.thinking` (``<think>`` splitting), :mod:`~clover_agent.protocol.scanner`
(the one-pass scanner), :mod:`~clover_agent.protocol.values` (values converted by JSON Schema),
:mod:`~clover_agent.protocol.reader` (the lenient and strict readers) and
:mod:`~clover_agent.protocol.rendering` (calls as text). Prompts are rendered by the model's chat
template on the backend side (:func:`clover_agent.backends.engine.render_prompt`). The format, the
rules, and the choices where the serving engines disagree, are in ``docs/tool-call-parsing.md``.
"""

from clover_agent.protocol.messages import (
    FORMAT_REMINDER,
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    AssistantTurn,
    ToolCall,
    ToolCallFormatError,
    format_error_message,
    new_call_id,
)
from clover_agent.protocol.reader import (
    MAX_REPLY_CHARS,
    parse_assistant,
    parse_tool_calls,
    tool_call_problem,
    tool_parameters,
)
from clover_agent.protocol.rendering import format_assistant_text, format_tool_call
from clover_agent.protocol.scanner import BrokenBlock, OpenCall, Progress, ScannedCall, scan_progress
from clover_agent.protocol.thinking import THINK_CLOSE, THINK_OPEN, ThinkingSplitter, split_thinking
from clover_agent.protocol.values import convert_value, read_value

__all__ = [
    "FORMAT_REMINDER",
    "FUNCTION_CLOSE",
    "FUNCTION_OPEN",
    "MAX_REPLY_CHARS",
    "PARAMETER_CLOSE",
    "PARAMETER_OPEN",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "AssistantTurn",
    "BrokenBlock",
    "OpenCall",
    "Progress",
    "ScannedCall",
    "ThinkingSplitter",
    "ToolCall",
    "ToolCallFormatError",
    "convert_value",
    "format_assistant_text",
    "format_error_message",
    "format_tool_call",
    "new_call_id",
    "parse_assistant",
    "parse_tool_calls",
    "read_value",
    "scan_progress",
    "split_thinking",
    "tool_call_problem",
    "tool_parameters",
]
