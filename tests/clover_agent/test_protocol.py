"""The Qwen3.6 protocol: tool-call parsing (the serving engines' conformance cases), the strict
reader's format errors, thinking, and prompts rendered by the chat template."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from clover_agent.engine.chat import bundled_chat_template
from clover_agent.protocol import (
    FORMAT_REMINDER,
    ThinkingSplitter,
    ToolCall,
    ToolCallFormatError,
    convert_value,
    format_assistant_text,
    parse_assistant,
    parse_tool_calls,
    render_prompt,
    split_thinking,
)
from tests.clover_agent.tool_specs import SHELL_AND_FINISH

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
CASES_FILE = json.loads((FIXTURES / "tool-call-parser-cases.json").read_text())
CASES = CASES_FILE["cases"]
GOLDEN = json.loads(
    (Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "qwen3.6-chat-golden.json").read_text()
)
TEMPLATE = bundled_chat_template()

#: Cases where the engines disagree or leave the result open, with what docs/tool-call-parsing.md
#: says we do: (content, calls). These are asserted exactly.
DOCUMENTED_CHOICES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    # A bare <function=...> block (no <tool_call> wrapper) is read as a call (vLLM); the text around stays.
    "v07_fallback_no_tool_call_tags": (
        "",
        [{"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX"}}],
    ),
    "s14_implicit_param_close_no_wrapper": (
        "Text prefix + implicit parameter close test",
        [{"name": "get_current_weather", "arguments": {"location": "Paris", "unit": "celsius", "days": 3}}],
    ),
    # "null" stays a string where the schema allows only strings (vLLM; SGLang turns it into null).
    "v16_string_null_literal_preserved": ("", [{"name": "search", "arguments": {"query": "null"}}]),
    # An unreadable header or a truncated call is not a call; its text leaves the content (the
    # strict reader reports it to the model instead).
    "v11_malformed_function_no_gt": ("", []),
    "s10_incomplete_no_crash": ("", []),
    # A tool call written inside the reasoning is part of the reasoning, never run.
    "l05_tool_call_inside_reasoning_is_not_a_call": (
        "",
        [{"name": "python", "arguments": {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'}}],
    ),
    # A <tool_call> block with no <function=...> in it is prose about the format: it stays in the content.
    "v30_inline_empty_tool_call_keeps_content": (
        "I'll show: <tool_call>example</tool_call>. Now real:",
        [{"name": "log", "arguments": {"msg": "hi"}}],
    ),
}


def _tools(schemas: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": name, "parameters": params}}
        for name, params in schemas.items()
    ]


def _case_text(case: dict[str, Any]) -> str:
    return case["input"] if isinstance(case["input"], str) else "".join(case["input"])


def _plain(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in calls]


def test_fixture_is_the_shared_reference_copy() -> None:
    if not SHARED_REFERENCE.is_dir():
        pytest.skip(f"no shared reference folder at {SHARED_REFERENCE}")
    assert json.loads((SHARED_REFERENCE / "tool-call-parser-cases.json").read_text()) == CASES_FILE
    assert len(CASES) == 66


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_parser_conformance_case(case: dict[str, Any]) -> None:
    content, calls = parse_tool_calls(_case_text(case), _tools(case["tools"]))
    assert all(isinstance(c, ToolCall) and c.id.startswith("call_") for c in calls)
    if case["id"] in DOCUMENTED_CHOICES:
        expected_content, expected_calls = DOCUMENTED_CHOICES[case["id"]]
        assert content == expected_content
        assert _plain(calls) == expected_calls
        return
    expected = case["expected_calls"]
    assert expected is not None, "every case without expected calls has a documented choice"
    assert _plain(calls) == expected
    for call, want in zip(calls, expected, strict=True):
        assert list(call.arguments) == list(want["arguments"])  # emission order kept
    spec = case["expected_content"]
    if spec == "__none_or_ws__" or spec is None:
        assert content.strip() == ""
    elif isinstance(spec, str):
        assert content == spec
    elif "contains" in spec:
        assert spec["contains"] in content
    elif "contains_all" in spec:
        assert all(piece in content for piece in spec["contains_all"])
    else:
        assert content.startswith(spec["startswith"])


def test_reasoning_is_split_from_the_cases_with_thinking() -> None:
    by_id = {c["id"]: c for c in CASES}
    for case_id in ("l01_thinking_then_content", "l02_thinking_tool_call"):
        reasoning, _ = split_thinking(_case_text(by_id[case_id]))
        assert reasoning == "I'm\nthinking"
    turn = parse_assistant(
        _case_text(by_id["l05_tool_call_inside_reasoning_is_not_a_call"]),
        _tools(by_id["l05_tool_call_inside_reasoning_is_not_a_call"]["tools"]),
    )
    assert turn.reasoning is not None and 'print("Not the real call!")' in turn.reasoning
    assert [c.arguments["code"] for c in turn.tool_calls] == [
        'def hello():\n    print("Hello, world!")\n\nhello()'
    ]


def test_split_thinking_without_close_tag() -> None:
    assert split_thinking("<think>\nstill going") == ("still going", "")
    assert split_thinking("plain answer") == (None, "plain answer")
    assert split_thinking("<think>\na\n</think>\n\nb") == ("a", "b")


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


def test_value_framing_keeps_inner_and_extra_whitespace() -> None:
    tools = _tools({"write": {"type": "object", "properties": {"text": {"type": "string"}}}})
    text = "<tool_call>\n<function=write>\n<parameter=text>\n\n  two blank edges\n\n\n</parameter>\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, tools)
    assert calls[0].arguments == {"text": "\n  two blank edges\n\n"}


# -- the strict reader -----------------------------------------------------------------------------


def _strict_error(text: str) -> ToolCallFormatError:
    with pytest.raises(ToolCallFormatError) as info:
        parse_assistant(text, SHELL_AND_FINISH)
    message = str(info.value)
    assert message.startswith("Your tool call could not be used")
    assert FORMAT_REMINDER in message
    return info.value


def test_strict_accepts_a_good_turn() -> None:
    text = "Checking.\n</think>\n\nRunning it.\n<tool_call>\n<function=shell>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
    turn = parse_assistant(text, SHELL_AND_FINISH)
    assert turn.reasoning == "Checking."
    assert turn.content == "Running it."
    assert _plain(turn.tool_calls) == [{"name": "shell", "arguments": {"command": "ls -la", "timeout": 30}}]


def test_strict_unclosed_call() -> None:
    error = _strict_error("Let me look.\n<tool_call>\n<function=shell>\n<parameter=command>\nls")
    assert error.problems == ["<function=shell> is not closed with </function>"]
    assert error.content.startswith("Let me look.\n<tool_call>")  # what the model wrote, kept for it to see


def test_strict_unknown_tool_lists_the_available_ones() -> None:
    error = _strict_error(
        "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
    )
    assert error.problems == ["there is no tool named `bash`; the available tools are: finish, shell"]


def test_strict_invalid_arguments_carry_the_schema_message() -> None:
    missing = _strict_error(
        "<tool_call>\n<function=shell>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>"
    )
    assert missing.problems == ["invalid arguments for `shell`: 'command' is a required property"]
    wrong = _strict_error(
        "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\nsoon\n</parameter>\n</function>\n</tool_call>"
    )
    assert wrong.problems == ["invalid arguments for `shell` at `timeout`: 'soon' is not of type 'integer'"]


def test_strict_bad_header_and_bare_tool_call_block() -> None:
    header = _strict_error("<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>")
    assert header.problems == ["the function header `<function={{ name }}>` is not <function=NAME>"]
    json_style = _strict_error('<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call>')
    assert json_style.problems == ["a <tool_call> block without <function=NAME> inside"]


def test_strict_reports_every_problem_and_runs_nothing() -> None:
    text = (
        "<tool_call>\n<function=finish>\n<parameter=summary>\ndone\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>\n<tool_call>\n<function=shell>\n"
    )
    error = _strict_error(text)
    assert error.problems == [
        "there is no tool named `nope`; the available tools are: finish, shell",
        "<function=shell> is not closed with </function>",
    ]


def test_truncation_anywhere_never_crashes() -> None:
    """Every prefix of a real turn (a model cut off mid-call) is either a turn or a format error."""
    text = render_prompt(
        [{"role": "user", "content": "u"}, _assistant_with_calls()],
        SHELL_AND_FINISH,
        TEMPLATE,
        add_generation_prompt=False,
    ).split("<|im_start|>assistant\n", 1)[1]
    outcomes = set()
    for end in range(len(text) + 1):
        try:
            parse_assistant(text[:end], SHELL_AND_FINISH)
            outcomes.add("turn")
        except ToolCallFormatError:
            outcomes.add("format error")
        parse_tool_calls(text[:end], SHELL_AND_FINISH)
    assert outcomes == {"turn", "format error"}


# -- rendering ---------------------------------------------------------------------------------------


def _assistant_with_calls() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "I will list the files.",
        "reasoning_content": "The user wants a listing.",
        "tool_calls": [
            ToolCall("shell", {"command": "ls -la\n", "timeout": 30}, id="call_a").to_message(),
            ToolCall(
                "finish", {"summary": "\nvalue with </parameter> inside\n<parameter=x>"}, id="call_b"
            ).to_message(),
        ],
    }


def _conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is here?"},
        _assistant_with_calls(),
        {"role": "tool", "tool_call_id": "call_a", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "call_b", "content": "ok"},
    ]


def test_render_prompt_places_tools_calls_and_results() -> None:
    prompt = render_prompt(_conversation(), SHELL_AND_FINISH, TEMPLATE)
    system = prompt.split("<|im_end|>", 1)[0]
    assert system.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(SHELL_AND_FINISH[0], ensure_ascii=False) in system
    assert system.endswith("You are a coding agent.")
    assert (
        "<think>\nThe user wants a listing.\n</think>\n\nI will list the files.\n\n"
        "<tool_call>\n<function=shell>\n<parameter=command>\nls -la\n\n</parameter>\n<parameter=timeout>\n30\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=finish>\n"
    ) in prompt
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        in prompt
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert render_prompt(_conversation(), SHELL_AND_FINISH, TEMPLATE, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_render_prompt_matches_the_golden_tool_round_trip() -> None:
    case = next(c for c in GOLDEN["cases"] if c["name"] == "10_tool_round_trip")
    assert render_prompt(case["inputs"]["messages"], case["inputs"]["tools"], TEMPLATE) == case["rendered"]


def test_render_prompt_accepts_json_string_arguments() -> None:
    message = _assistant_with_calls()
    for call in message["tool_calls"]:
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    with_strings = render_prompt([{"role": "user", "content": "q"}, message], SHELL_AND_FINISH, TEMPLATE)
    assert with_strings == render_prompt(
        [{"role": "user", "content": "q"}, _assistant_with_calls()], SHELL_AND_FINISH, TEMPLATE
    )


def test_round_trip_rendered_calls_parse_back_to_the_same_calls() -> None:
    prompt = render_prompt(_conversation()[:3], SHELL_AND_FINISH, TEMPLATE, add_generation_prompt=False)
    assistant_text = prompt.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    turn = parse_assistant(assistant_text, SHELL_AND_FINISH)
    assert turn.reasoning == "The user wants a listing."
    assert turn.content == "I will list the files."
    assert _plain(turn.tool_calls) == [
        {"name": "shell", "arguments": {"command": "ls -la\n", "timeout": 30}},
        {"name": "finish", "arguments": {"summary": "\nvalue with </parameter> inside\n<parameter=x>"}},
    ]


def test_round_trip_golden_assistant_turn() -> None:
    case = next(c for c in GOLDEN["cases"] if c["name"] == "10_tool_round_trip")
    assistant = case["inputs"]["messages"][2]
    text = case["rendered"].split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    turn = parse_assistant(text, case["inputs"]["tools"])
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]
    ]
    assert (turn.reasoning, turn.content) == (assistant["reasoning_content"], assistant["content"])


def test_format_assistant_text_round_trips() -> None:
    calls = [
        ToolCall("shell", {"command": "echo '<tool_call>'", "timeout": 5}),
        ToolCall("finish", {"summary": ""}),
    ]
    text = format_assistant_text("Done soon.", "thinking", calls)
    turn = parse_assistant(text, SHELL_AND_FINISH)
    assert (turn.reasoning, turn.content, _plain(turn.tool_calls)) == (
        "thinking",
        "Done soon.",
        _plain(calls),
    )


def _editor_call(path: str, text: str) -> str:
    return format_assistant_text("", None, [ToolCall("editor", {"path": path, "file_text": text})])


EDITOR_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "editor",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "file_text": {"type": "string"}},
            },
        },
    }
]


def test_values_quoting_several_calls_stay_whole() -> None:
    """A file that documents the format (two complete calls in it) is one value, and a real call
    after it is still a call."""
    quoted = f"Examples:\n{_editor_call('a', 'one')}\nand\n{_editor_call('b', 'two')}\nend"
    text = _editor_call("docs.md", quoted) + "\n" + _editor_call("next.txt", "x")
    content, calls = parse_tool_calls(text, EDITOR_TOOLS)
    assert content == ""
    assert _plain(calls) == [
        {"name": "editor", "arguments": {"path": "docs.md", "file_text": quoted}},
        {"name": "editor", "arguments": {"path": "next.txt", "file_text": "x"}},
    ]


def test_a_large_value_full_of_close_tags_stays_whole() -> None:
    quoted = "s = '</parameter>\\n</function>'\n" * 3000 + "</parameter>\n</function>\n" * 500
    _, calls = parse_tool_calls(_editor_call("big.py", quoted), EDITOR_TOOLS)
    assert _plain(calls) == [{"name": "editor", "arguments": {"path": "big.py", "file_text": quoted}}]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_thinking_splitter_across_any_piece_boundaries(size: int) -> None:
    text = "plan: use </thi tags carefully\n</think>\n\nThe answer.\n"
    splitter = ThinkingSplitter(thinking=True)
    out = [item for i in range(0, len(text), size) for item in splitter.feed(text[i : i + size])]
    out += splitter.flush()
    reasoning = "".join(piece for kind, piece in out if kind == "reasoning")
    answer = "".join(piece for kind, piece in out if kind == "text")
    assert (reasoning, answer) == ("plan: use </thi tags carefully\n", "The answer.\n")
    assert [kind for kind, _ in out] == sorted((kind for kind, _ in out), key=["reasoning", "text"].index)


def test_thinking_splitter_without_thinking_and_unfinished_thinking() -> None:
    assert ThinkingSplitter(thinking=False).feed("</think> is text") == [("text", "</think> is text")]
    splitter = ThinkingSplitter(thinking=True)
    assert splitter.feed("still thinking </th") == [("reasoning", "still thinking ")]
    assert splitter.flush() == [("reasoning", "</th")]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_strict_reader_never_crashes_on_the_cases(case: dict[str, Any]) -> None:
    """Every case is a turn or a format error, even with schemas that are not valid JSON Schema
    (``"type": "float"``): a broken tool spec is not the model's fault and skips validation."""
    try:
        turn = parse_assistant(_case_text(case), _tools(case["tools"]))
    except ToolCallFormatError as error:
        assert error.problems
    else:
        assert all(call.name in case["tools"] for call in turn.tool_calls)


def test_random_tag_soup_never_crashes() -> None:
    """Seeded fuzzing with the format's own tags: every text is a turn or a format error."""
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "<function=shell>",
        "<function=",
        "</function>",
        "<parameter=command>",
    ]
    pieces += [
        "<parameter=timeout>",
        "<parameter=",
        "</parameter>",
        "</parameter",
        "</parameter1>",
        "<think>",
    ]
    pieces += ["</think>", "\n", "  ", "ls", "42", "{", "}", "'", '"', ">", "<", "=", "x"]
    rng = random.Random(7)
    outcomes = set()
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        try:
            turn = parse_assistant(text, SHELL_AND_FINISH)
            outcomes.add("turn with calls" if turn.tool_calls else "turn")
        except ToolCallFormatError:
            outcomes.add("format error")
        parse_tool_calls(text, SHELL_AND_FINISH)
    assert outcomes == {"turn", "turn with calls", "format error"}


def test_strict_function_body_that_is_not_parameters() -> None:
    error = _strict_error("<tool_call>\n<function=shell>\nls -la\n</function>\n</tool_call>")
    assert error.problems == [
        "inside <function=shell> there must be only <parameter=NAME>VALUE</parameter> blocks"
    ]
    junk = _strict_error("<tool_call>\nshell:\n<function=shell>\n</function>\n</tool_call>")
    assert junk.problems == ["unexpected text between <tool_call> and <function=NAME>"]
