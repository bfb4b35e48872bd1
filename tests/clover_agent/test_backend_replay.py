"""The replay backend: turns read from a JSON Lines file, parsed like a model's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.backends import BackendEvent, ReplayExhausted, create_backend
from clover_agent.backends.replay import ReplayBackend
from clover_agent.errors import ExitCode, UsageError
from tests.clover_agent.tool_specs import SHELL_TOOL

TOOLS = [SHELL_TOOL]
FIRST = (
    "The tests live in tests/.\n</think>\n\nLet me run them.\n<tool_call>\n<function=shell>\n"
    "<parameter=command>\npytest -q\n</parameter>\n<parameter=timeout>\n60\n</parameter>\n</function>\n</tool_call>"
)
SECOND = "All green now."


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def test_turns_come_in_order_parsed_and_streamed(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "run.jsonl", [json.dumps({"content": FIRST}), "", json.dumps({"content": SECOND})]
    )
    backend = create_backend("replay", path=path)
    assert isinstance(backend, ReplayBackend)
    assert backend.name == "replay:run.jsonl"
    messages = [{"role": "user", "content": "fix the tests"}]
    events: list[BackendEvent] = []

    first = await backend.complete(messages, TOOLS, on_event=events.append)
    assert first.reasoning == "The tests live in tests/."
    assert first.content == "Let me run them."
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("shell", {"command": "pytest -q", "timeout": 60})
    ]
    assert first.raw == FIRST
    assert first.finish_reason == "tool_calls"
    assert first.format_error is None
    assert first.prompt_tokens == backend.count_tokens(messages, TOOLS) > 0
    assert [(e.kind, e.text) for e in events] == [
        ("reasoning", "The tests live in tests/."),
        ("text", FIRST.split("</think>\n\n", 1)[1]),
    ]

    second = await backend.complete(messages, TOOLS)
    assert (second.content, second.tool_calls, second.finish_reason) == (SECOND, [], "stop")


async def test_a_paced_turn_without_reasoning_streams_its_text_in_pieces(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", [json.dumps({"content": SECOND, "seconds": 0.01})])
    events: list[BackendEvent] = []
    turn = await create_backend("replay", path=path).complete([], TOOLS, on_event=events.append)
    assert (turn.reasoning, turn.content) == (None, SECOND)
    assert {e.kind for e in events} == {"text"}
    assert len(events) > 1 and "".join(e.text for e in events) == SECOND


async def test_running_out_is_a_clear_agent_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.jsonl", [json.dumps({"content": SECOND})])
    backend = ReplayBackend(path)
    await backend.complete([{"role": "user", "content": "q"}], TOOLS)
    with pytest.raises(ReplayExhausted) as info:
        await backend.complete([{"role": "user", "content": "q"}], TOOLS)
    assert info.value.exit_code == ExitCode.AGENT_ERROR
    assert str(path) in info.value.message
    assert "all 1 were used" in info.value.message


async def test_a_malformed_call_becomes_a_format_error(tmp_path: Path) -> None:
    broken = "Running.\n<tool_call>\n<function=shell>\n<parameter=command>\nls"
    backend = ReplayBackend(_write(tmp_path / "bad.jsonl", [json.dumps({"content": broken})]))
    turn = await backend.complete([{"role": "user", "content": "q"}], TOOLS)
    assert turn.tool_calls == []
    assert turn.format_error is not None and "<function=shell> is not closed" in turn.format_error
    assert turn.content == broken  # the model sees what it wrote
    assert turn.to_message() == {"role": "assistant", "content": broken}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', 'each line must be an object {"content": "<assistant text>"}'),
        ('{"text": "wrong key"}', 'each line must be an object {"content": "<assistant text>"}'),
    ],
)
def test_malformed_lines_name_the_line(tmp_path: Path, line: str, problem: str) -> None:
    path = _write(tmp_path / "r.jsonl", [json.dumps({"content": "ok"}), "", line])
    with pytest.raises(UsageError) as info:
        ReplayBackend(path)
    assert info.value.message.startswith(f"{path}:3: ")
    assert problem in info.value.message


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the replay file"):
        create_backend("replay", path=tmp_path / "absent.jsonl")


def test_a_binary_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b'{"content": "ok"}\n\xd0\x00\xff')
    with pytest.raises(UsageError, match=f"{path} is not a UTF-8 text file"):
        create_backend("replay", path=path)


def test_unknown_backend_kind() -> None:
    with pytest.raises(UsageError, match="choose one of: engine, openai, replay"):
        create_backend("magic")


def test_a_replay_resumed_after_some_turns_starts_after_them(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", [json.dumps({"content": FIRST}), json.dumps({"content": SECOND})])
    backend = ReplayBackend(path, start=1)
    assert backend.used == 1 and backend.turns[backend.used].text == SECOND


def test_the_prompt_estimate_counts_what_a_conversation_adds_and_what_was_replaced(tmp_path: Path) -> None:
    """The estimate of a grown conversation equals a fresh count of it; a message replaced (as the
    condenser replaces an output) is counted anew."""
    path = _write(tmp_path / "run.jsonl", [json.dumps({"content": SECOND})])
    kept, fresh = ReplayBackend(path), ReplayBackend(path)
    messages = [{"role": "system", "content": "S" * 700}, {"role": "user", "content": "task"}]
    for i in range(6):
        assert kept.count_tokens(messages, TOOLS) == ReplayBackend(path).count_tokens(list(messages), TOOLS)
        messages = [
            *messages,
            {"role": "tool", "tool_call_id": f"c{i}", "name": "shell", "content": "x" * 350 * i},
        ]
    before = kept.count_tokens(messages, TOOLS)
    messages[-1] = {**messages[-1], "content": "[dropped]"}
    assert kept.count_tokens(messages, TOOLS) == fresh.count_tokens(messages, TOOLS) < before - 400
