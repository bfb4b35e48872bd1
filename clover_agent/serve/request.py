"""A chat-completions request body, read and checked field by field (it is untrusted input): the
OpenAI fields the server honours, Clover's decoding controls as extra fields, everything else
ignored. A field of the wrong type or out of range is an :class:`ApiError` 400 naming it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clover_agent.serve.errors import ApiError, bad_request

#: Roles a message may have ("developer" is OpenAI's newer name for "system").
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Most stop strings a request may give.
MAX_STOP_STRINGS = 16
#: Deepest nesting of arrays and objects a body may have (a tool's JSON Schema included): deeper
#: bodies would exhaust the recursion of whatever walks them later (the chat template, a schema).
MAX_DEPTH = 64
#: Seeds a request may give: what a 64-bit generator takes.
SEED_RANGE = range(-(2**63), 2**64)

#: Clover's decoding controls accepted as extra body fields: name -> JSON type (the engine's
#: ``SamplingParams`` field of the same name checks the value).
CLOVER_FIELDS: dict[str, str] = {
    "mode": "string",
    "threshold": "number",
    "top_k": "integer",
    "repetition_penalty": "number",
    "thinking_budget": "integer",
    "thinking_ramp_start": "number",
    "thinking_ramp_strength": "number",
    "end_bias_start": "number",
    "end_bias_strength": "number",
    "loop_action": "string",
    "loop_penalty": "number",
    "draft_steps": "integer",
    "confidence": "string",
    "causal_context": "boolean",
    "fuse_commit": "boolean",
    "ignore_eos": "boolean",
}
#: Ranges (inclusive) a request's numbers must fall in, past the engine's own checks: values the
#: engine takes but its float32 sampling turns into inf or NaN (a temperature of 1e-308 or 1e308,
#: a top_p of 5e-324, a penalty of 1e308, a bias strength of 1e308), which fail the request deep
#: in decoding. 0 stays allowed for temperature (greedy).
SAFE_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (1e-6, 100.0),
    "top_p": (1e-6, 1.0),
    "repetition_penalty": (0.01, 100.0),
    "presence_penalty": (0.0, 100.0),
    "frequency_penalty": (0.0, 100.0),
    "loop_penalty": (1.0, 100.0),
    "thinking_ramp_strength": (0.0, 1e4),
    "end_bias_strength": (0.0, 1e4),
}
#: OpenAI sampling fields and the ``SamplingParams`` field each sets.
OPENAI_SAMPLING: dict[str, tuple[str, str]] = {
    "temperature": ("temperature", "number"),
    "top_p": ("top_p", "number"),
    "seed": ("seed", "integer"),
    "presence_penalty": ("presence_penalty", "number"),
    "frequency_penalty": ("frequency_penalty", "number"),
}


@dataclass(frozen=True)
class ChatRequest:
    """What a request asks for. ``tools`` is empty when none are offered (``tool_choice: "none"``
    included); ``sampling`` holds ``SamplingParams`` fields to change; ``enable_thinking`` None
    leaves the server's default."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    enable_thinking: bool | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    #: ``parallel_tool_calls``: False allows one call per answer (the answer ends with it).
    parallel_tool_calls: bool = True


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past what a float holds
        return False


def _is(value: Any, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "array":
        return isinstance(value, list)
    raise ValueError(kind)


def _typed(body: Mapping[str, Any], name: str, kind: str, *, nullable: bool = True) -> Any:
    """``body[name]`` when it has the JSON type ``kind`` (None when absent or null)."""
    value = body.get(name)
    if value is None and nullable:
        return None
    if not _is(value, kind):
        raise bad_request(f"'{name}' must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}", param=name)
    return value


def _text_content(content: Any, where: str) -> str | None:
    """A message's content as text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise bad_request(
                    f"'{where}' may hold only text parts ({{'type': 'text', 'text': ...}})", where
                )
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"'{where}' must be a string or a list of text parts", where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"'{where}' must be an array", where)
    out = []
    for j, call in enumerate(calls):
        here = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad_request(
                f"'{here}' must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", here
            )
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                arguments = None
        if not isinstance(arguments, Mapping):
            raise bad_request(f"'{here}.function.arguments' must be a JSON object (as a string)", here)
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _message(message: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, Mapping):
        raise bad_request(f"'{where}' must be an object", where)
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}", f"{where}.role")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _text_content(message.get("content"), f"{where}.content"),
    }
    if role == "assistant":
        if message.get("tool_calls"):
            out["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str):
            out["reasoning_content"] = reasoning
    elif out["content"] is None:
        raise bad_request(f"'{where}.content' is required for a {role} message", f"{where}.content")
    if role == "tool" and isinstance(message.get("tool_call_id"), str):
        out["tool_call_id"] = message["tool_call_id"]
    if out["content"] is None:
        out["content"] = ""
    return out


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools = _typed(body, "tools", "array") or []
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(function, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise bad_request(
                f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name', ...}}}}", "tools"
            )
        if "parameters" in function and not isinstance(function["parameters"], Mapping):
            raise bad_request(f"'tools[{i}].function.parameters' must be a JSON Schema object", "tools")
        out.append({"type": "function", "function": dict(function)})
    return out


def _tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools offered: all of them (``auto``), none (``none``). ``required`` and a named
    function are refused: nothing in decoding would make the model call a tool."""
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        return tools
    if choice == "none":
        return []
    if choice == "required" or isinstance(choice, Mapping):
        raise bad_request(
            "tool_choice 'required' and a named function are not supported (the server does not force "
            "a call); use 'auto' (offer only the tool you want in 'tools') or 'none'",
            param="tool_choice",
            code="unsupported_value",
        )
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or a function", "tool_choice")


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' may hold at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(stops)


def _thinking(body: Mapping[str, Any]) -> bool | None:
    kwargs = _typed(body, "chat_template_kwargs", "object") or {}
    value = kwargs.get("enable_thinking", body.get("enable_thinking"))
    if value is not None and not isinstance(value, bool):
        raise bad_request("'enable_thinking' must be a boolean", "chat_template_kwargs")
    return value


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = _typed(body, name, "integer")
        if value is not None:
            if value < 1:
                raise bad_request(f"'{name}' must be at least 1", name)
            return int(value)
    return None


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name, (target, kind) in OPENAI_SAMPLING.items():
        value = _typed(body, name, kind)
        if value is not None:
            changes[target] = float(value) if kind == "number" else value
    for name, kind in CLOVER_FIELDS.items():
        value = _typed(body, name, kind)
        if value is not None:
            changes[name] = float(value) if kind == "number" else value
    for name, (low, high) in SAFE_RANGES.items():
        value = changes.get(name)
        if value is not None and not (low <= value <= high or (name == "temperature" and value == 0.0)):
            raise bad_request(f"'{name}' must be in [{low:g}, {high:g}] (got {value:g})", name)
    if changes.get("seed", 0) not in SEED_RANGE:
        raise bad_request("'seed' must fit in 64 bits", "seed")
    if "temperature" in changes and changes["temperature"] == 0.0:
        changes.setdefault("top_p", 1.0)
        changes.setdefault("top_k", 0)  # greedy: the filters change nothing; stated for the record
    return changes


def _unsupported(body: Mapping[str, Any]) -> None:
    n = _typed(body, "n", "integer")
    if n is not None and n != 1:
        raise bad_request("'n' must be 1 (one choice per request)", "n", "unsupported_value")
    if body.get("logprobs") is True:
        raise bad_request("'logprobs' is not supported", "logprobs", "unsupported_value")
    form = body.get("response_format")
    if form is not None and not (isinstance(form, Mapping) and form.get("type") == "text"):
        raise bad_request(
            "'response_format' may only be {'type': 'text'}: nothing in decoding holds the answer to JSON "
            "or a schema",
            "response_format",
            "unsupported_value",
        )


def _check_depth(body: Any) -> None:
    """:class:`ApiError` 400 when arrays and objects nest deeper than :data:`MAX_DEPTH` (walked
    without recursion: the walk itself must not be what a hostile body exhausts)."""
    level: list[Any] = [body]
    for _ in range(MAX_DEPTH + 1):
        level = [
            child
            for value in level
            for child in (
                value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
            )
        ]
        if not level:
            return
    raise bad_request(f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels")


def read_chat_request(body: Any) -> ChatRequest:
    """The request in ``body`` (the parsed JSON), or :class:`ApiError` 400 naming the field at fault."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    _check_depth(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required (a string)", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array", "messages")
    _unsupported(body)
    options = _typed(body, "stream_options", "object") or {}
    return ChatRequest(
        model=model,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=_tool_choice(body, _tools(body)),
        stream=bool(_typed(body, "stream", "boolean")),
        include_usage=options.get("include_usage") is True,
        enable_thinking=_thinking(body),
        stop=_stop(body),
        max_tokens=_max_tokens(body),
        sampling=_sampling(body),
        parallel_tool_calls=_typed(body, "parallel_tool_calls", "boolean") is not False,
    )


__all__ = ["CLOVER_FIELDS", "ApiError", "ChatRequest", "read_chat_request"]
