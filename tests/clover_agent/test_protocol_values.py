"""Values converted by their JSON Schema (``clover_agent.protocol.values``): every conversion keeps
what the model wrote, or says why it cannot (the strict reader turns that into a format error)."""

from __future__ import annotations

from typing import Any

import pytest

from clover_agent.protocol import convert_value, read_value


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        # An engine maps any other text to false; we keep it, and validation reports it.
        ("yes", {"type": "boolean"}, "yes"),
        ("abc", {"type": "integer"}, "abc"),
        ("3.0", {"type": "integer"}, 3),
        ("1e3", {"type": "number"}, 1000.0),
        ("NaN", {"type": "number"}, "NaN"),
        ("1e999", {"type": "number"}, "1e999"),  # not finite
        ("9" * 5000, {"type": "integer"}, "9" * 5000),  # past Python's digit limit: kept as text
        ("[" * 100_000, {"type": "array"}, "[" * 100_000),  # nesting too deep: kept as text
        ("None", {"type": ["integer", "null"]}, None),
        ("None", {"type": "string"}, "None"),
        ("[1, 2]", {}, "[1, 2]"),  # no type information: the text as written
        ("(1, 'a')", {"type": "array"}, [1, "a"]),
        ("{1: 2}", {"type": "object"}, "{1: 2}"),  # not a JSON object (integer key)
        ("x", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x"),  # next type when the first fails
        ("\n  indented\n", {"type": "string"}, "\n  indented\n"),  # strings are verbatim
    ],
)
def test_convert_value(raw: str, schema: dict[str, Any], expected: Any) -> None:
    assert convert_value(raw, schema) == expected


@pytest.mark.parametrize(
    ("raw", "schema", "problem"),
    [
        ("1.5", {"type": "integer"}, "`1.5` is not a whole number"),
        ("1.0000000000000001", {"type": "int"}, "`1.0000000000000001` is not a whole number"),
        ("12345678901234567890.5", {"type": "integer"}, "`12345678901234567890.5` is not a whole number"),
        ("1e5000", {"type": "integer"}, "`1e5000` has more digits than a number may have (4300)"),
        (
            "1.00000000000000000001",
            {"type": "number"},
            "`1.00000000000000000001` has more digits than a number holds (it would be read as 1.0)",
        ),
        (
            "1e-400",
            {"type": "number"},
            "`1e-400` has more digits than a number holds (it would be read as 0.0)",
        ),
        ("1e999", {"type": "number"}, "`1e999` is out of range for a number"),
        ('{"a": 1, "a": 2}', {"type": "object"}, "the key `a` appears twice in one object"),
        ("{'a': 1, 'a': 2}", {"type": "object"}, "the key `a` appears twice in one object"),
        ("[1e999]", {"type": "array"}, "`1e999` is out of range for a number"),
        (
            "['a', 0.30000000000000000001]",
            {"type": "array"},
            "`0.30000000000000000001` has more digits than a number holds (it would be read as 0.3)",
        ),
    ],
)
def test_a_reading_that_would_lose_information_is_refused_with_the_reason(
    raw: str, schema: dict[str, Any], problem: str
) -> None:
    assert read_value(raw, schema) == (raw, problem)
    assert convert_value(raw, schema) == raw


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("9007199254740993.0", {"type": "integer"}, 9007199254740993),  # exact, not through a float
        ("1e2", {"type": "integer"}, 100),
        ("-0", {"type": "integer"}, 0),
        ("0.1", {"type": "number"}, 0.1),
        ("-2.5e-3", {"type": "number"}, -0.0025),
        ("7", {"type": "number"}, 7),
        ("٣", {"type": "integer"}, "٣"),  # digits of other scripts are text, not numbers
        ("[1.5, -2, true, null]", {"type": "array"}, [1.5, -2, True, None]),
        ("[1.5, -2, True, None, 'x', +3]", {"type": "array"}, [1.5, -2, True, None, "x", 3]),
        ("{'a': (1, 2)}", {"type": "object"}, {"a": [1, 2]}),
        ("{1, 2}", {"type": "array"}, "{1, 2}"),  # a set is not JSON
        ("[b'x']", {"type": "array"}, "[b'x']"),  # nor are bytes
        ("[1+2j]", {"type": "array"}, "[1+2j]"),
        ("[NaN]", {"type": "array"}, "[NaN]"),
    ],
)
def test_exact_readings(raw: str, schema: dict[str, Any], expected: Any) -> None:
    value, problem = read_value(raw, schema)
    assert (value, type(value), problem) == (expected, type(expected), None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("42", 42),
        ("-7", -7),
        ("042", "042"),  # not how 42 is written: the model may mean the text
        ("3.0", "3.0"),
        ("+5", "+5"),
        ("1.5", "1.5"),  # an integer or a string: a string
        (" 42", " 42"),
    ],
)
def test_with_a_string_allowed_only_the_exact_spelling_is_typed(raw: str, expected: Any) -> None:
    assert convert_value(raw, {"type": ["integer", "string"]}) == expected


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("true", {"type": ["boolean", "string"]}, True),
        ("True", {"type": ["boolean", "string"]}, "True"),
        ("1.5", {"anyOf": [{"type": "number"}, {"type": "string"}]}, 1.5),
        ("1.50", {"anyOf": [{"type": "number"}, {"type": "string"}]}, "1.50"),
        ('{"a": 1}', {"type": ["object", "string"]}, {"a": 1}),
        ("{'a': 1}", {"type": ["object", "string"]}, "{'a': 1}"),  # no Python literals then
        ('"[1]"', {"type": ["array", "string"]}, '"[1]"'),  # nor a second decoding
        ("42", {"type": ["string", "integer"]}, "42"),  # string first: always the text
    ],
)
def test_typed_or_string(raw: str, schema: dict[str, Any], expected: Any) -> None:
    value = convert_value(raw, schema)
    assert (value, type(value)) == (expected, type(expected))


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("2", {"enum": ["1", 2]}, 2),  # the member named, though a string member comes first
        ("1", {"enum": ["1", 2]}, "1"),
        ("view", {"type": "string", "enum": ["view", "create"]}, "view"),
        (" view", {"type": "string", "enum": ["view", "create"]}, " view"),  # validation reports it
        ("null", {"type": "string"}, "null"),
        ("null", {"type": ["string", "null"]}, None),  # null is read first (conformance case v31)
        ("None", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
    ],
)
def test_enums_and_null(raw: str, schema: dict[str, Any], expected: Any) -> None:
    value = convert_value(raw, schema)
    assert (value, type(value)) == (expected, type(expected))


HOSTILE = [
    "9" * 5000,
    "-" + "9" * 5000,
    "9" * 4300 + ".5",
    "0." + "0" * 5000 + "1",
    "1e-99999999999999999999",
    "1e99999999999999999999",
    "[1e-99999999999999999999]",
    "{'a': 1e99999999999999999999}",
    "[" + "9" * 5000 + "]",
    "[" * 1000 + "]" * 1000,
    "(" * 300 + ")" * 300,
    "{'a': " * 200 + "1" + "}" * 200,
    "'\ud800'",
    '["\\ud800"]',
    "[1_0.5]",
    "[0x10]",
    "[__import__('os')]",
    "{**{}}",
    "[*[]]",
    "[f'x']",
    "[...]",
    "1e",
    "١٢٣",
    "[\x00]",
    "-Infinity",
]
SCHEMAS: list[Any] = [
    {"type": t} for t in ("integer", "number", "boolean", "object", "array", "string", "float")
]
SCHEMAS += [
    {"type": ["integer", "string"]},
    {"type": ["array", "string"]},
    {"enum": [1, "1", None, 1.5]},
    {"anyOf": [{"type": "integer"}, {"type": "array"}]},
    {},
    None,
]


@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_is_a_value_or_a_reason_never_an_exception(raw: str) -> None:
    for schema in SCHEMAS:
        value, problem = read_value(raw, schema)
        assert problem is None or (value == raw and isinstance(problem, str))
