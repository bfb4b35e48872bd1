"""The Qwen3.6 chat format as the agent speaks it: prompts in, reasoning / content / tool calls out.

A tool call is written by the model as::

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are raw text; each is converted by its parameter's JSON schema (:func:`convert_value`).
Two readers share one scanner:

- :func:`parse_tool_calls` is lenient, like the serving engines' parsers: it recovers what it can
  (a missing ``</parameter>``, a drifted close marker, a call without the ``<tool_call>`` wrapper)
  and drops blocks that are not calls.
- :func:`parse_assistant` is what the agent loop uses: the same recovery, but a block it cannot read,
  an unknown tool or arguments that fail the tool's JSON schema raise :class:`ToolCallFormatError`,
  whose message is written for the model.

Where the serving engines disagree, the choices are documented in ``docs/tool-call-parsing.md``.
Prompts are rendered by the model's own chat template (:func:`render_prompt`).
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from clover_agent.engine.chat import render_chat

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_CLOSE = "</function>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

#: What a format error shows the model.
FORMAT_REMINDER = (
    "Use exactly this format, one block per call, after any text:\n"
    "<tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n"
    "</function>\n</tool_call>"
)

_FUNCTION_HEADER = re.compile(r"<function=([^>\n]*)>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\n]*)>")
# `</parameter>` and the drifted forms models write: `</parameter1>`, `</parameter_function>`,
# and `</parameter` with the `>` missing.
_PARAMETER_CLOSE = re.compile(r"</parameter(?:\w*>|(?=\s)|$)")
_TOOL_CALL_CLOSE_AFTER = re.compile(r"\s*</tool_call>")
_PARAMETER_MARKER = re.compile(r"</parameter|<parameter=")
_SPACE = re.compile(r"\s*")
_CALL_TAGS = re.compile(r"<function=|</function>|<tool_call>|</tool_call>")
_OPENERS = re.compile(r"<tool_call>|<function=")
# Names with braces, quotes, spaces or angle brackets are template residue ("{{ tc.name }}"), not calls.
_NAME = re.compile(r"[\w.:\-]+")
_INTEGER = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TYPE_ALIASES = {
    "int": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "str": "string",
    "text": "string",
    "dict": "object",
    "list": "array",
}
#: How many ``</function>`` positions (of each kind: with and without a ``</tool_call>`` after) are
#: tried as the end of one call; bounds the work on pathological text. Real calls need one, or two
#: when a value quotes a whole call.
_MAX_END_CANDIDATES = 64


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


# --------------------------------------------------------------------------------------------------
# Tool specs and value conversion


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


def _schema_types(schema: Any) -> list[str]:
    """The JSON types a schema allows, in the order written (``anyOf``/``oneOf`` flattened, a bare
    ``enum`` typed by its values, aliases such as ``float`` normalised)."""
    if not isinstance(schema, Mapping):
        return []
    found: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, str):
        found.append(declared)
    elif isinstance(declared, list):
        found += [t for t in declared if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            found += _schema_types(sub)
    if not found and isinstance(schema.get("enum"), list):
        found += [_json_type(v) for v in schema["enum"]]
    normalised = [_TYPE_ALIASES.get(t, t) for t in found]
    return list(dict.fromkeys(normalised))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_FAILED = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _as_json_value(value: Any) -> Any:
    """A Python literal made JSON-compatible (tuples become lists), or ``_FAILED``."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _FAILED
    if isinstance(value, (list, tuple)):
        items = [_as_json_value(v) for v in value]
        return _FAILED if any(v is _FAILED for v in items) else items
    if isinstance(value, dict):
        pairs = {k: _as_json_value(v) for k, v in value.items()}
        if any(not isinstance(k, str) or v is _FAILED for k, v in pairs.items()):
            return _FAILED
        return pairs
    return _FAILED


def _load_structured(text: str) -> Any:
    """JSON first; then a Python literal (models write ``{'a': 'b'}`` or ``True``); else ``_FAILED``."""
    try:
        return json.loads(text, strict=False, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        pass
    try:
        return _as_json_value(ast.literal_eval(text))
    except Exception:  # literal_eval raises many types (and RecursionError on deep nesting)
        return _FAILED


def _convert_structured(text: str, kind: type) -> Any:
    value = _load_structured(text)
    if isinstance(value, str):  # encoded twice: a JSON string holding the object
        value = _load_structured(value.strip())
    return value if isinstance(value, kind) else _FAILED


def _convert_integer(text: str) -> Any:
    number = _convert_number(text)
    if isinstance(number, float) and number.is_integer():
        return int(number)
    return number if isinstance(number, int) else _FAILED


def _convert_number(text: str) -> Any:
    try:  # int() refuses more than 4300 digits; float() overflows to inf
        if _INTEGER.fullmatch(text):
            return int(text)
        if _NUMBER.fullmatch(text) and math.isfinite(value := float(text)):
            return value
    except ValueError:
        pass
    return _FAILED


def _convert_boolean(text: str) -> Any:
    lowered = text.lower()
    return {"true": True, "false": False}.get(lowered, _FAILED)


_CONVERTERS = {
    "integer": _convert_integer,
    "number": _convert_number,
    "boolean": _convert_boolean,
    "object": lambda text: _convert_structured(text, dict),
    "array": lambda text: _convert_structured(text, list),
}


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """Convert a parameter's raw text by its schema.

    The allowed types are tried in the order the schema lists them; the first that the text reads as
    wins. ``null``/``None`` become None only where the schema allows null. A string type keeps the
    text verbatim, and so does a text no allowed type reads as (validation then reports it), and a
    parameter with no type information.
    """
    types = _schema_types(schema)
    text = raw.strip()
    if "null" in types and text in ("null", "None"):
        return None
    for kind in types:
        if kind == "string":
            return raw
        converter = _CONVERTERS.get(kind)
        if converter is not None:
            value = converter(text)
            if value is not _FAILED:
                return value
    return raw


# --------------------------------------------------------------------------------------------------
# Scanning


@dataclass
class _Call:
    name: str
    raw_arguments: list[tuple[str, str]]
    residue: int = 0  # close tags in its values with no opener before them (see _unopened_closes)


@dataclass
class _Broken:
    """A block that tried to be a call and could not be read. ``in_content``: the text stays in the
    content (it may be prose about the format), else it is taken out."""

    text: str
    problem: str
    in_content: bool = False


_Item = str | _Call | _Broken


def _skip_space(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches


def _strays(text: str) -> int:
    """Close markers that only a call can own; left in plain text they mean a call was cut short."""
    return len(_PARAMETER_CLOSE.findall(text)) + text.count(FUNCTION_CLOSE)


def _unopened_closes(value: str) -> int:
    """``</function>`` / ``</tool_call>`` in a value with no matching opener before them: a quoted
    call is balanced, the tail of a call the value swallowed is not."""
    depth = {FUNCTION_CLOSE: 0, TOOL_CALL_CLOSE: 0}
    unopened = 0
    for tag in _CALL_TAGS.findall(value):
        close = FUNCTION_CLOSE if "function" in tag else TOOL_CALL_CLOSE
        if tag != close:
            depth[close] += 1
        elif depth[close]:
            depth[close] -= 1
        else:
            unopened += 1
    return unopened


def _strip_framing(value: str) -> str:
    """Remove the one newline the format puts after ``<parameter=...>`` and the one before the close;
    any other whitespace belongs to the value."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


class _Scanner:
    """Splits a text into plain text, calls and broken blocks.

    A value may quote the format itself (a file holding ``</parameter>`` or a whole call), so the end
    of a call is not simply the first ``</function>``: every ``</function>`` is a candidate (those
    followed by ``</tool_call>`` first), and the first one after which the text reads cleanly wins:
    no stray ``</parameter>`` or ``</function>`` left outside a call, and no value holding a
    ``</function>`` or ``</tool_call>`` it did not open (the tail of another call it swallowed);
    when none does, the one with the fewest such strays. Inside a call, a parameter ends at a close
    marker or a ``<parameter=NAME>`` only when NAME is a parameter of the tool not given yet.
    """

    def __init__(self, text: str, parameters: Mapping[str, dict[str, Any] | None]) -> None:
        self.text = text
        self.parameters = parameters
        self._memo: dict[int, tuple[list[_Item], int]] = {}

    def scan(self) -> list[_Item]:
        return self._from(0)[0]

    def _from(self, pos: int) -> tuple[list[_Item], int]:
        """Items from ``pos`` to the end, and how many stray close markers they leave in the text."""
        if pos in self._memo:
            return self._memo[pos]
        text = self.text
        found = None
        search = pos
        while found is None:
            opener = _OPENERS.search(text, search)
            if opener is None:
                break
            found = self._item_at(opener)
            search = opener.end()  # a bare "<function=" that is not a call is plain text
        if found is None:
            result: tuple[list[_Item], int] = ([text[pos:]] if pos < len(text) else [], _strays(text[pos:]))
        else:
            start, item, end = found
            rest, strays = self._from(end)
            before = text[pos:start]
            strays += _strays(before)
            if isinstance(item, _Broken) and item.in_content:
                strays += _strays(item.text)
            if isinstance(item, _Call):
                strays += item.residue
            result = (([before] if before else []) + [item, *rest], strays)
        self._memo[pos] = result
        return result

    def _item_at(self, opener: re.Match[str]) -> tuple[int, _Item, int] | None:
        """``(start, item, end)`` for the block an opener starts; None when it is plain text."""
        start = opener.start()
        if opener.group() != TOOL_CALL_OPEN:
            return self._call_at(start, start, wrapped=False)
        header_at = _skip_space(self.text, opener.end())
        if self.text.startswith("<function=", header_at):
            return self._call_at(start, header_at, wrapped=True)
        end = self._block_end(start)
        block = self.text[start:end]
        if "<function=" in block:
            return start, _Broken(block, "unexpected text between <tool_call> and <function=NAME>"), end
        return (
            start,
            _Broken(block, "a <tool_call> block without <function=NAME> inside", in_content=True),
            end,
        )

    def _block_end(self, start: int) -> int:
        close = self.text.find(TOOL_CALL_CLOSE, start)
        return len(self.text) if close < 0 else close + len(TOOL_CALL_CLOSE)

    def _call_at(self, start: int, header_at: int, wrapped: bool) -> tuple[int, _Item, int] | None:
        """The call starting at ``start`` (its header at ``header_at``) and where it ends; None for a
        bare ``<function=`` that is not a call."""
        text = self.text
        header = _FUNCTION_HEADER.match(text, header_at)
        name = header.group(1) if header else ""
        if header is None or not _NAME.fullmatch(name):
            if not wrapped:
                return None
            end = self._block_end(start)
            shown = text[header_at : header_at + 60].split("\n")[0]
            return (
                start,
                _Broken(text[start:end], f"the function header `{shown}` is not <function=NAME>"),
                end,
            )
        schema = self.parameters.get(name)
        known = None
        if schema is not None and isinstance(schema.get("properties"), Mapping):
            known = set(schema["properties"])
        body_start = header.end()
        best: tuple[int, _Call, int] | None = None
        closed = False
        for close, end in self._function_ends(body_start):
            closed = True
            arguments = self._arguments(text[body_start:close], known)
            if arguments is None:
                continue
            call = _Call(name, arguments, sum(_unopened_closes(value) for _, value in arguments))
            strays = call.residue + self._from(end)[1]
            if best is None or strays < best[0]:
                best = (strays, call, end)
            if strays == 0:
                break
        if best is not None:
            return start, best[1], best[2]
        if not wrapped:
            return None
        end = self._block_end(start)
        if closed:
            problem = f"inside <function={name}> there must be only <parameter=NAME>VALUE</parameter> blocks"
        else:
            problem = f"<function={name}> is not closed with </function>"
        return start, _Broken(text[start:end], problem), end

    def _function_ends(self, body_start: int) -> Iterator[tuple[int, int]]:
        """``(position of </function>, end of the call)`` candidates after ``body_start``: those
        followed by ``</tool_call>`` (a value quoting "</function>" rarely quotes both), then the
        others, at most :data:`_MAX_END_CANDIDATES` of each; then the last one in the text."""
        text = self.text
        for with_tail in (True, False):
            search, given = body_start, 0
            while given < _MAX_END_CANDIDATES:
                close = text.find(FUNCTION_CLOSE, search)
                if close < 0:
                    break
                search = close + len(FUNCTION_CLOSE)
                tail = _TOOL_CALL_CLOSE_AFTER.match(text, search)
                if bool(tail) == with_tail:
                    given += 1
                    yield close, tail.end() if tail else search
        last = text.rfind(FUNCTION_CLOSE)
        if last >= body_start:
            tail = _TOOL_CALL_CLOSE_AFTER.match(text, last + len(FUNCTION_CLOSE))
            yield last, tail.end() if tail else last + len(FUNCTION_CLOSE)

    @staticmethod
    def _arguments(body: str, known: set[str] | None) -> list[tuple[str, str]] | None:
        """The (name, raw value) pairs of a function body, or None when the body is not parameters."""
        pairs: list[tuple[str, str]] = []
        pos = _skip_space(body, 0)
        while pos < len(body):
            opener = _PARAMETER_OPEN.match(body, pos)
            if opener is None or not opener.group(1).strip():
                return None
            name = opener.group(1).strip()
            seen = {n for n, _ in pairs} | {name}

            def is_next(candidate: str, seen: set[str] = seen) -> bool:
                return candidate not in seen and (known is None or candidate in known)

            value_start = opener.end()
            value_end, pos = len(body), len(body)
            scan = value_start
            while scan < len(body):
                marker = _PARAMETER_MARKER.search(body, scan)
                if marker is None:
                    break
                if marker.group() == "<parameter=":
                    following = _PARAMETER_OPEN.match(body, marker.start())
                    if following and is_next(following.group(1).strip()):
                        value_end, pos = marker.start(), marker.start()
                        break
                else:
                    close = _PARAMETER_CLOSE.match(body, marker.start())
                    if close:
                        after = _skip_space(body, close.end())
                        following = _PARAMETER_OPEN.match(body, after)
                        if after == len(body) or (following and is_next(following.group(1).strip())):
                            value_end, pos = marker.start(), after
                            break
                scan = marker.end()
            pairs.append((name, _strip_framing(body[value_start:value_end])))
        return pairs


# --------------------------------------------------------------------------------------------------
# Public readers


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
            return ([("reasoning", head)] if head else []) + self._answer(tail)
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


@dataclass
class _Parsed:
    reasoning: str | None
    rest: str  # the text after the reasoning
    content: str
    blocks: list[
        tuple[str, dict[str, Any]] | _Broken
    ]  # calls (name, converted arguments) and broken blocks, in order

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [block for block in self.blocks if isinstance(block, tuple)]


def _parse(text: str, tools: Sequence[Mapping[str, Any]]) -> _Parsed:
    parameters = tool_parameters(tools)
    reasoning, rest = split_thinking(text)
    try:
        items = _Scanner(rest, parameters).scan()
    except RecursionError:  # thousands of calls in one message
        items = [_Broken(rest, "too many tool calls in one message", in_content=True)]
    pieces: list[str] = []
    blocks: list[tuple[str, dict[str, Any]] | _Broken] = []
    for item in items:
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, _Call):
            properties = (parameters.get(item.name) or {}).get("properties")
            if not isinstance(properties, Mapping):
                properties = {}
            blocks.append(
                (
                    item.name,
                    {key: convert_value(value, properties.get(key)) for key, value in item.raw_arguments},
                )
            )
        else:
            blocks.append(item)
            if item.in_content:
                pieces.append(item.text)
    return _Parsed(reasoning, rest, "".join(pieces).strip(), blocks)


def parse_tool_calls(text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str, list[ToolCall]]:
    """Lenient: ``(content, calls)`` from an assistant text. Reasoning (up to ``</think>``) is
    neither; blocks that cannot be read as calls are dropped; calls to tools not in ``tools`` are
    returned with their values as strings."""
    parsed = _parse(text, tools)
    return parsed.content, [ToolCall(name, arguments) for name, arguments in parsed.calls]


def tool_call_problem(
    name: str, arguments: Mapping[str, Any], parameters: Mapping[str, dict[str, Any] | None]
) -> str | None:
    """Why a call cannot run (unknown tool, arguments its JSON schema rejects), for the model; None
    when it can. ``parameters`` is :func:`tool_parameters` of the tools offered. A schema that is not
    valid JSON Schema is not held against the model: those arguments are not checked here."""
    if name not in parameters:
        available = ", ".join(sorted(parameters)) or "(none)"
        return f"there is no tool named `{name}`; the available tools are: {available}"
    schema = parameters[name]
    if schema is None:
        return None
    validator = jsonschema.validators.validator_for(schema)(schema)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType):
        return None  # the tool's schema is broken (e.g. "type": "float"): not the model's fault
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"invalid arguments for `{name}`" + (f" at `{where}`" if where else "") + f": {error.message}"


def format_error_message(problems: Sequence[str]) -> str:
    """The message a model gets back for unusable tool calls."""
    listed = "\n".join(f"- {p}" for p in problems)
    return f"Your tool call could not be used, so no tool was run:\n{listed}\n{FORMAT_REMINDER}\nWrite the call again."


def parse_assistant(text: str, tools: Sequence[Mapping[str, Any]]) -> AssistantTurn:
    """Strict: the turn, or :class:`ToolCallFormatError` when any call is unreadable, names a tool not
    in ``tools`` or has arguments its schema rejects (then no call of the turn should run)."""
    parsed = _parse(text, tools)
    parameters = tool_parameters(tools)
    problems = [
        block.problem if isinstance(block, _Broken) else tool_call_problem(*block, parameters)
        for block in parsed.blocks
    ]
    problems = [p for p in problems if p]
    if problems:
        raise ToolCallFormatError(
            format_error_message(problems),
            problems=problems,
            content=parsed.rest.strip(),
            reasoning=parsed.reasoning,
        )
    return AssistantTurn(
        content=parsed.content,
        reasoning=parsed.reasoning,
        tool_calls=[ToolCall(name, arguments) for name, arguments in parsed.calls],
    )


# --------------------------------------------------------------------------------------------------
# Rendering


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call as the model writes it (and the chat template renders it): strings verbatim, other
    values as JSON. :func:`parse_tool_calls` reads it back to the same call."""
    lines = [TOOL_CALL_OPEN, f"<function={name}>"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines += [f"<parameter={key}>", text, "</parameter>"]
    lines += [FUNCTION_CLOSE, TOOL_CALL_CLOSE]
    return "\n".join(lines)


def format_assistant_text(content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
    """The raw assistant text for a turn whose parts arrived separately (an OpenAI-style server):
    what a replay file stores and :func:`parse_assistant` reads back."""
    parts = [f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n\n" if reasoning else "", content.strip()]
    if calls:
        parts.append(
            ("\n\n" if content.strip() else "")
            + "\n".join(format_tool_call(c.name, c.arguments) for c in calls)
        )
    return "".join(parts)


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the template wants it: tool-call arguments as a dict, not a JSON string."""
    out = dict(message)
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            call = dict(call)
            function = dict(call.get("function", {}))
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"] or "{}")
            call["function"] = function
            calls.append(call)
        out["tool_calls"] = calls
    return out


def render_prompt(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template: str,
    *,
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for ``messages`` with the model's chat template: tools in the system turn,
    tool calls in the format above, tool results as ``<tool_response>`` in a user turn."""
    return render_chat(
        template,
        [_template_message(m) for m in messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
    )
