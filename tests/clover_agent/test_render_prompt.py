"""Prompts rendered by the model's chat template (the engine backend's ``render_prompt``), and the
protocol reading what the template renders: the golden round trip, calls rendered then parsed back,
and every prefix of a rendered turn (a model cut off) read as a turn or a format error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clover_agent.backends.engine import render_prompt
from clover_agent.engine.text.chat import bundled_chat_template
from clover_agent.protocol import ToolCall, ToolCallFormatError, parse_assistant, parse_tool_calls
from tests.clover_agent.tool_specs import SHELL_AND_FINISH

GOLDEN = json.loads(
    (Path(__file__).resolve().parents[1] / "engine" / "fixtures" / "qwen3.6-chat-golden.json").read_text()
)
TEMPLATE = bundled_chat_template()


def _plain(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in calls]


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
