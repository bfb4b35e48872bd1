"""The Qwen3.6 protocol: tool-call parsing (the serving engines' conformance cases), where values
end when they quote the format, the strict reader's format errors, and thinking. Values by schema:
test_protocol_values.py; fuzzing: test_protocol_fuzz.py; prompts: test_render_prompt.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clover_agent.protocol import (
    FORMAT_REMINDER,
    ThinkingSplitter,
    ToolCall,
    ToolCallFormatError,
    format_assistant_text,
    format_tool_call,
    parse_assistant,
    parse_tool_calls,
    split_thinking,
)
from tests.clover_agent.tool_specs import SHELL_AND_FINISH

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: The project's shared reference folder, beside the checkout (or a worktree's parent folders).
SHARED_REFERENCE = next(
    (
        p / "shared" / "reference"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "reference").is_dir()
    ),
    Path("shared") / "reference",
)
CASES_FILE = json.loads((FIXTURES / "tool-call-parser-cases.json").read_text())
CASES = CASES_FILE["cases"]

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


def _editor(path: str, text: str) -> str:
    return format_tool_call("editor", {"path": path, "file_text": text})


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
    quoted = f"Examples:\n{_editor('a', 'one')}\nand\n{_editor('b', 'two')}\nend"
    text = _editor("docs.md", quoted) + "\n" + _editor("next.txt", "x")
    content, calls = parse_tool_calls(text, EDITOR_TOOLS)
    assert content == ""
    assert _plain(calls) == [
        {"name": "editor", "arguments": {"path": "docs.md", "file_text": quoted}},
        {"name": "editor", "arguments": {"path": "next.txt", "file_text": "x"}},
    ]


def test_a_large_value_full_of_close_tags_stays_whole() -> None:
    quoted = "s = '</parameter>\\n</function>'\n" * 3000 + "</parameter>\n</function>\n" * 500
    _, calls = parse_tool_calls(_editor("big.py", quoted), EDITOR_TOOLS)
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


def test_strict_function_body_that_is_not_parameters() -> None:
    error = _strict_error("<tool_call>\n<function=shell>\nls -la\n</function>\n</tool_call>")
    assert error.problems == [
        "inside <function=shell> there must be only <parameter=NAME>VALUE</parameter> blocks"
    ]
    junk = _strict_error("<tool_call>\nshell:\n<function=shell>\n</function>\n</tool_call>")
    assert junk.problems == ["unexpected text between <tool_call> and <function=NAME>"]


# -- where a value ends (docs/tool-call-parsing.md, "Structure") -----------------------------------


def test_a_value_quoting_hundreds_of_calls_runs_none_of_them() -> None:
    """A file of examples with 200 complete calls in it (64 were enough to have them run before) is
    one value, and the real call after it still runs."""
    examples = "\n".join(f"Example {i}:\n{_editor(f'/tmp/x{i}', 'rm -rf /')}" for i in range(200))
    text = "Writing the examples.\n" + _editor("examples.md", examples) + "\n" + _editor("next.txt", "x")
    turn = parse_assistant(text, EDITOR_TOOLS)
    assert turn.content == "Writing the examples."
    assert _plain(turn.tool_calls) == [
        {"name": "editor", "arguments": {"path": "examples.md", "file_text": examples}},
        {"name": "editor", "arguments": {"path": "next.txt", "file_text": "x"}},
    ]


def test_quoted_calls_nested_deep_stay_whole() -> None:
    text = "innermost"
    for depth in range(40):
        text = _editor(f"level{depth}.md", f"level {depth}:\n{text}\n")
    _, calls = parse_tool_calls(text + "\n" + _editor("after.txt", "y"), EDITOR_TOOLS)
    assert [c.arguments["path"] for c in calls] == ["level39.md", "after.txt"]
    assert format_tool_call("editor", calls[0].arguments) == text


def test_a_value_with_a_call_header_it_never_closes() -> None:
    """Parser tests quote headers alone ("<function=shell>" with no "</function>"): the value ends at
    the last call end of the text, so a last call holding one is read whole; a call after it is
    read into the value (data, never run), as docs/tool-call-parsing.md says."""
    source = 'assert parse("<tool_call>\n<function=shell>\n<parameter=command>\nls") == []\n'
    alone = parse_assistant(_editor("test_parse.py", source), EDITOR_TOOLS)
    assert _plain(alone.tool_calls) == [
        {"name": "editor", "arguments": {"path": "test_parse.py", "file_text": source}}
    ]
    followed = _editor("test_parse.py", source) + "\n" + _editor("next.txt", "x")
    _, calls = parse_tool_calls(followed, EDITOR_TOOLS)
    assert [c.arguments["path"] for c in calls] == ["test_parse.py"]
    assert calls[0].arguments["file_text"].endswith("<parameter=file_text>\nx")


def test_a_value_holding_the_close_sequence_before_a_call_ends_there() -> None:
    """The one shape the format cannot tell apart: a value holding `</parameter>`, `</function>`,
    `</tool_call>` with a call after them reads as two calls (then the tail is data)."""
    value = "end of a call:\n</parameter>\n</function>\n</tool_call>\n" + _editor("b", "two") + "\nmore"
    _, calls = parse_tool_calls(_editor("a", value), EDITOR_TOOLS)
    assert [c.arguments["path"] for c in calls] == ["a", "b"]
    assert calls[0].arguments["file_text"] == "end of a call:"
    assert calls[1].arguments["file_text"].startswith("two\n</parameter>\n</function>\n</tool_call>\nmore")


def test_close_tags_that_cannot_end_a_call_are_data() -> None:
    """A `</function>` that is followed by a stray close tag, or by text and then a call (when it
    is not the full close sequence), does not end the value."""
    value = "a</function>\n</parameter>b\nc\n</parameter>\n</function>\nprose <function=x>d</function>"
    text = _editor("f", value) + "\n" + _editor("g", "y")
    _, calls = parse_tool_calls(text, EDITOR_TOOLS)
    assert _plain(calls) == [
        {"name": "editor", "arguments": {"path": "f", "file_text": value}},
        {"name": "editor", "arguments": {"path": "g", "file_text": "y"}},
    ]


def test_a_left_out_close_ends_a_value_only_at_a_line_start() -> None:
    """`<parameter=NAME>` with no `</parameter>` before it ends the value when it starts a line (the
    model forgot the close), not when prose mentions it."""
    mention = "<tool_call>\n<function=shell>\n<parameter=command>\necho use <parameter=timeout> for it\n</parameter>\n</function>\n</tool_call>"
    assert parse_assistant(mention, SHELL_AND_FINISH).tool_calls[0].arguments == {
        "command": "echo use <parameter=timeout> for it"
    }
    forgot = "<tool_call>\n<function=shell>\n<parameter=command>\nls\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>"
    assert parse_assistant(forgot, SHELL_AND_FINISH).tool_calls[0].arguments == {
        "command": "ls",
        "timeout": 5,
    }


def test_stray_tags_after_a_call_do_not_undo_it() -> None:
    call = "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    turn = parse_assistant(call + "\n</tool_call>", SHELL_AND_FINISH)
    assert (turn.content, _plain(turn.tool_calls)) == (
        "</tool_call>",
        [{"name": "shell", "arguments": {"command": "ls"}}],
    )


def test_crlf_text_keeps_its_carriage_returns() -> None:
    """Only the newline the format puts around a value is removed; a `\\r` belongs to the value."""
    text = "<tool_call>\r\n<function=finish>\r\n<parameter=summary>\r\nok\r\n</parameter>\r\n</function>\r\n</tool_call>"
    assert parse_assistant(text, SHELL_AND_FINISH).tool_calls[0].arguments == {"summary": "\r\nok\r"}


def test_a_bare_call_never_closed_is_text() -> None:
    text = "Like this: <function=shell>\n<parameter=command>\nls"
    assert parse_tool_calls(text, SHELL_AND_FINISH) == (text, [])
    assert parse_assistant(text, SHELL_AND_FINISH).content == text


def test_a_lossy_value_is_a_format_error_naming_the_parameter() -> None:
    call = "<tool_call>\n<function=shell>\n<parameter=command>\nsleep 1\n</parameter>\n<parameter=timeout>\n{}\n</parameter>\n</function>\n</tool_call>"
    for written, problem in [
        ("1.5", "`1.5` is not a whole number"),
        ("1.0000000000000001", "`1.0000000000000001` is not a whole number"),
    ]:
        error = _strict_error(call.format(written))
        assert error.problems == [f"invalid arguments for `shell` at `timeout`: {problem}"]
    assert parse_assistant(call.format("3.0"), SHELL_AND_FINISH).tool_calls[0].arguments["timeout"] == 3


def test_offered_only_keeps_a_call_to_a_tool_not_offered_as_its_text() -> None:
    unknown = "<tool_call>\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>"
    known = "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    text = f"First.\n{unknown}\n{known}"
    # like vLLM: the unknown call is returned, values as strings
    assert [c.name for c in parse_tool_calls(text, SHELL_AND_FINISH)[1]] == ["rm", "shell"]
    content, calls = parse_tool_calls(text, SHELL_AND_FINISH, offered_only=True)
    assert content == f"First.\n{unknown}"
    assert _plain(calls) == [{"name": "shell", "arguments": {"command": "ls"}}]
