"""Parameter values converted by their JSON Schema, never losing what the model wrote.

A value arrives as raw text. The types its schema allows are tried in the order written (``type`` as
a string or a list, ``anyOf``/``oneOf`` flattened, a bare ``enum`` typed by its members, aliases
such as ``float`` normalised) and the first that reads the text wins. A reading never drops
anything: ``1.5`` is not an integer, a number with more digits than a float holds is not silently
rounded, an object does not keep the last of two equal keys. Where the schema also allows a string,
a typed reading must be the value's exact JSON spelling (``42``, ``true``, ``1.5``), otherwise the text
stays the string the model wrote (``042``, ``True``, ``3.0``). docs/tool-call-parsing.md lists the rules.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tokenize
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

#: Most characters a number may have (Python's own limit on the digits of an integer).
MAX_NUMBER_CHARS = 4300

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
_INTEGER = re.compile(r"[-+]?[0-9]+")
_JSON_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_FAILED = object()  # the text does not read as the type (validation then says so)


class _Lossy(Exception):
    """The text reads as the type only by losing part of it; the message says what, for the model."""


def schema_types(schema: Any) -> list[str]:
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
            found += schema_types(sub)
    if not found and isinstance(schema.get("enum"), list):
        found += [_json_type(v) for v in schema["enum"]]
    return list(dict.fromkeys(_TYPE_ALIASES.get(t, t) for t in found))


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


# -- numbers -------------------------------------------------------------------------------------


def _shown(text: str) -> str:
    return f"`{text}`" if len(text) <= 40 else f"`{text[:20]}…{text[-10:]}` ({len(text)} characters)"


def _too_long(text: str) -> _Lossy:
    return _Lossy(f"{_shown(text)} has more digits than a number may have ({MAX_NUMBER_CHARS})")


def _whole(text: str) -> int:
    """An integer literal (digits, optional sign) as an int."""
    if len(text) > MAX_NUMBER_CHARS:
        raise _too_long(text)
    return int(text)


def _decimal(text: str) -> Decimal:
    """A decimal literal, exactly. Its exponent may be past what a float or an int can hold (at most
    :data:`MAX_NUMBER_CHARS` digits in all), never past what the decimal module computes with."""
    if len(text) > MAX_NUMBER_CHARS:
        raise _too_long(text)
    exponent = text.lower().partition("e")[2]
    if len(exponent.lstrip("+-")) > 6:  # |exponent| >= 10**6: no float or allowed int is that big or small
        raise _Lossy(f"{_shown(text)} is out of range for a number")
    return Decimal(text)


def _exact_float(text: str) -> float:
    """``text`` (a decimal literal) as a float, when the float is that same number to the digits
    written (``0.1`` is; ``0.10000000000000000001`` and ``1e-400`` are not)."""
    exact = _decimal(text)
    value = float(exact)
    if not math.isfinite(value):
        raise _Lossy(f"{_shown(text)} is out of range for a number")
    if Decimal(repr(value)) != exact:
        raise _Lossy(f"{_shown(text)} has more digits than a number holds (it would be read as {value!r})")
    return value


def _read_integer(text: str, exact: bool) -> Any:
    if exact:
        return _whole(text) if _JSON_INTEGER.fullmatch(text) else _FAILED
    if not _DECIMAL.fullmatch(text):
        return _FAILED
    number = _decimal(text)
    if number.adjusted() >= MAX_NUMBER_CHARS:
        raise _too_long(text)
    whole = int(number)  # exact: at most MAX_NUMBER_CHARS digits before the point
    if number != whole:
        raise _Lossy(f"{_shown(text)} is not a whole number")
    return whole


def _read_number(text: str, exact: bool) -> Any:
    if (_JSON_INTEGER if exact else _INTEGER).fullmatch(text):
        return _whole(text)
    if not _DECIMAL.fullmatch(text):
        return _FAILED
    value = _exact_float(text)
    return value if not exact or json.dumps(value) == text else _FAILED


def _read_boolean(text: str, exact: bool) -> Any:
    return {"true": True, "false": False}.get(text if exact else text.lower(), _FAILED)


# -- objects and arrays --------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Lossy(f"the key `{key}` appears twice in one object")
        out[key] = value
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(
            text,
            strict=False,
            parse_float=_exact_float,
            parse_constant=_reject_constant,
            object_pairs_hook=_unique_keys,
        )
    except (ValueError, RecursionError):  # not JSON, too deep, or an integer past Python's digit limit
        return _FAILED


class _NotLiteral(Exception):
    pass


def _python_literal(text: str) -> Any:
    """A Python literal made of JSON's values (models write ``{'a': 'b'}`` or ``True``; tuples become
    lists), read as carefully as JSON; ``_FAILED`` for anything else."""
    try:
        tree = ast.parse(text, mode="eval")
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError on hostile text
        return _FAILED
    numbers: Iterator[str] | None = None

    def number_text() -> str:  # the digits as written, for floats (the tree keeps only the float)
        nonlocal numbers
        if numbers is None:
            tokens = tokenize.generate_tokens(io.StringIO(text).readline)
            numbers = (token.string for token in tokens if token.type == tokenize.NUMBER)
        return next(numbers)

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, bool))):
            return node.value
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            written = number_text()  # taken for ints too, to stay in step with the tokens
            return _exact_float(written.replace("_", "")) if isinstance(node.value, float) else node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)
        ):
            number = value(node.operand)
            return -number if isinstance(node.op, ast.USub) else number
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.Dict):
            pairs = []
            for key, item in zip(node.keys, node.values, strict=True):
                name = value(key) if key is not None else None
                if not isinstance(name, str):
                    raise _NotLiteral
                pairs.append((name, value(item)))
            return _unique_keys(pairs)
        raise _NotLiteral

    try:
        return value(tree.body)
    except (_NotLiteral, RecursionError, tokenize.TokenError, StopIteration):
        return _FAILED


def _json_or_literal(text: str) -> Any:
    value = _json(text)
    return _python_literal(text) if value is _FAILED else value


def _structured(kind: type) -> Callable[[str, bool], Any]:
    """The reader of objects (``dict``) or arrays (``list``): JSON; unless exact, also a Python
    literal, and a JSON string holding one (encoded twice) decoded once more."""

    def read(text: str, exact: bool) -> Any:
        if exact:
            value = _json(text)
        else:
            value = _json_or_literal(text)
            if isinstance(value, str):
                value = _json_or_literal(value.strip())
        return value if isinstance(value, kind) else _FAILED

    return read


_READERS: dict[str, Callable[[str, bool], Any]] = {
    "integer": _read_integer,
    "number": _read_number,
    "boolean": _read_boolean,
    "object": _structured(dict),
    "array": _structured(list),
}


# -- the entry points ----------------------------------------------------------------------------


def _enum_member(raw: str, text: str, members: list[Any]) -> Any:
    """The member the text names: a string member written exactly, or another member written as
    its JSON; ``_FAILED`` when none is."""
    for member in members:
        if isinstance(member, str):
            if member == raw:
                return member
        elif json.dumps(member, ensure_ascii=False) == text:
            return member
    return _FAILED


def read_value(raw: str, schema: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """``(value, problem)`` for a parameter's raw text. ``problem`` says, for the model, why the text
    was not read as the type the schema asks for when the reason is not plain (``1.5`` for an
    integer, digits a number cannot hold, a key written twice); the value is then the raw text.

    ``null``/``None`` become None only where the schema allows null. A string type keeps the text
    verbatim, and so does a text no allowed type reads (validation then reports it) and a parameter
    with no type information.
    """
    types = schema_types(schema)
    text = raw.strip()
    if "null" in types and text in ("null", "None"):
        return None, None
    members = schema.get("enum") if isinstance(schema, Mapping) else None
    if isinstance(members, list) and (member := _enum_member(raw, text, members)) is not _FAILED:
        return member, None
    exact = "string" in types
    problem = None
    for kind in types:
        if kind == "string":
            return raw, None
        reader = _READERS.get(kind)
        if reader is None:
            continue
        try:
            value = reader(raw if exact else text, exact)  # exact: surrounding spaces are text too
        except _Lossy as lossy:
            problem = problem or str(lossy)
            continue
        if value is not _FAILED:
            return value, None
    return raw, problem


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter's raw text converted by its schema (see :func:`read_value`); the raw text when
    it reads as no type the schema allows."""
    return read_value(raw, schema)[0]
