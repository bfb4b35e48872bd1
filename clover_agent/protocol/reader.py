"""The two readers of an assistant text, sharing one scan (:mod:`clover_agent.protocol.scanner`):

- :func:`parse_tool_calls` is lenient, like the serving engines' parsers: it recovers what it can
  (a missing ``</parameter>``, a drifted close marker, a call without the ``<tool_call>`` wrapper)
  and drops blocks that are not calls.
- :func:`parse_assistant` is what the agent loop uses: the same reading, but a block it cannot read,
  an unknown tool, a value its schema cannot hold without loss, arguments that fail the tool's JSON
  schema, or a reply past :data:`MAX_REPLY_CHARS` raise :class:`ToolCallFormatError`, whose message
  is written for the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jsonschema

from clover_agent.protocol.messages import AssistantTurn, ToolCall, ToolCallFormatError, format_error_message
from clover_agent.protocol.scanner import BrokenBlock, ScannedCall, scan
from clover_agent.protocol.thinking import split_thinking
from clover_agent.protocol.values import read_value

#: Longest reply (characters, reasoning included) read for tool calls: twice what fits in Clover's
#: 128K-token context, so no reply the model can use again in its next prompt is refused. Past it the
#: strict reader answers with a format error and runs nothing; the lenient one returns no calls.
MAX_REPLY_CHARS = 1 << 20


def tool_parameters(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Tool name -> its parameters schema, from OpenAI-style specs (``{"type": "function",
    "function": {...}}``) or bare ``{"name", "parameters"}`` ones."""
    out: dict[str, dict[str, Any] | None] = {}
    for tool in tools:
        spec = tool.get("function", tool)
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            params = spec.get("parameters")
            out[spec["name"]] = dict(params) if isinstance(params, Mapping) else None
    return out


def tool_call_problem(
    name: str, arguments: Mapping[str, Any], parameters: Mapping[str, dict[str, Any] | None]
) -> str | None:
    """Why a call cannot run (unknown tool, arguments its JSON schema rejects), for the model; None
    when it can. ``parameters`` is :func:`tool_parameters` of the tools offered. A schema that is not
    valid JSON Schema is not held against the model: those arguments are not checked here."""
    return _problem(name, arguments, parameters, {})


def _problem(
    name: str,
    arguments: Mapping[str, Any],
    parameters: Mapping[str, dict[str, Any] | None],
    validators: dict[str, Any],
) -> str | None:
    """:func:`tool_call_problem`, with each tool's validator built once per reply (``validators``)."""
    if name not in parameters:
        available = ", ".join(sorted(parameters)) or "(none)"
        return f"there is no tool named `{name}`; the available tools are: {available}"
    schema = parameters[name]
    if schema is None:
        return None
    if name not in validators:
        validators[name] = jsonschema.validators.validator_for(schema)(schema)
    validator = validators[name]
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType):
        return None  # the tool's schema is broken (e.g. "type": "float"): not the model's fault
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"invalid arguments for `{name}`" + (f" at `{where}`" if where else "") + f": {error.message}"


class _Call(NamedTuple):
    name: str
    arguments: dict[str, Any]
    problem: str | None  # a value its schema could not hold without loss


@dataclass
class _Parsed:
    reasoning: str | None
    rest: str  # the text after the reasoning
    content: str
    blocks: list[_Call | BrokenBlock]  # in order

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(b.name, b.arguments) for b in self.blocks if isinstance(b, _Call)]


def _too_long(text: str, limit: int) -> str:
    return (
        f"the reply is {len(text):,} characters long, more than the {limit:,} a reply may have; "
        "write large files in several smaller calls (create a part, then add to it)"
    )


def _converted(call: ScannedCall, parameters: Mapping[str, dict[str, Any] | None]) -> _Call:
    properties = (parameters.get(call.name) or {}).get("properties")
    if not isinstance(properties, Mapping):
        properties = {}
    arguments: dict[str, Any] = {}
    problem = None
    for key, raw in call.arguments:
        arguments[key], why = read_value(raw, properties.get(key))
        if why and problem is None:
            problem = f"invalid arguments for `{call.name}` at `{key}`: {why}"
    return _Call(call.name, arguments, problem)


def _parse(
    text: str, tools: Sequence[Mapping[str, Any]], max_chars: int | None, offered_only: bool = False
) -> _Parsed:
    parameters = tool_parameters(tools)
    reasoning, rest = split_thinking(text)
    if max_chars is not None and len(text) > max_chars:
        return _Parsed(reasoning, rest, rest.strip(), [BrokenBlock(rest, _too_long(text, max_chars), True)])
    pieces: list[str] = []
    blocks: list[_Call | BrokenBlock] = []
    for item in scan(rest, parameters):
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, ScannedCall):
            if offered_only and item.name not in parameters:
                pieces.append(item.text)  # not a call: the text as the model wrote it
            else:
                blocks.append(_converted(item, parameters))
        else:
            blocks.append(item)
            if item.in_content:
                pieces.append(item.text)
    return _Parsed(reasoning, rest, "".join(pieces).strip(), blocks)


def parse_tool_calls(
    text: str,
    tools: Sequence[Mapping[str, Any]],
    *,
    max_chars: int | None = MAX_REPLY_CHARS,
    offered_only: bool = False,
) -> tuple[str, list[ToolCall]]:
    """Lenient: ``(content, calls)`` from an assistant text. Reasoning (up to ``</think>``) is
    neither; blocks that cannot be read as calls are dropped; calls to tools not in ``tools`` are
    returned with their values as strings (as vLLM does), or with ``offered_only`` are no calls:
    their text stays in the content as written (what ``serve`` answers). A text longer than
    ``max_chars`` is all content."""
    parsed = _parse(text, tools, max_chars, offered_only)
    return parsed.content, parsed.calls


def parse_assistant(
    text: str, tools: Sequence[Mapping[str, Any]], *, max_chars: int | None = MAX_REPLY_CHARS
) -> AssistantTurn:
    """Strict: the turn, or :class:`ToolCallFormatError` when any call is unreadable, names a tool not
    in ``tools``, has a value its schema cannot hold without loss or arguments its schema rejects,
    or the text is longer than ``max_chars`` (then no call of the turn should run)."""
    parsed = _parse(text, tools, max_chars)
    parameters = tool_parameters(tools)
    validators: dict[str, Any] = {}
    found = [
        block.problem
        if isinstance(block, BrokenBlock)
        else block.problem or _problem(block.name, block.arguments, parameters, validators)
        for block in parsed.blocks
    ]
    problems = [p for p in found if p]
    if problems:
        raise ToolCallFormatError(
            format_error_message(problems),
            problems=problems,
            content=parsed.rest.strip(),
            reasoning=parsed.reasoning,
        )
    return AssistantTurn(content=parsed.content, reasoning=parsed.reasoning, tool_calls=parsed.calls)
