"""The trajectory file is compact (each turn and output once, no streamed text) and reads back as
the events were emitted; resuming from it works as from the full events."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from clover_agent.agent import load_trajectory
from clover_agent.agent.trajectory import STREAM_EVENTS, TrajectoryError, TrajectoryWriter, read_events
from clover_agent.events import MessageAdded, ModelDelta, ModelResponded, ToolCallFinished, ToolOutput
from tests.clover_agent.test_agent_loop import FINISH, call, run_agent
from tests.git_repos import make_repo

MARK = "UNIQUE-REASONING-MARK"
BODY = "CREATED-FILE-BODY " * 20  # a long argument: once in the raw text, not again in the calls


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})


def count(path: Path, text: str) -> int:
    return path.read_text(encoding="utf-8").count(json.dumps(text)[1:-1])


async def test_each_turn_and_output_is_stored_once_and_read_back_whole(repo: Path, tmp_path: Path) -> None:
    turns = [
        f"<think>\n{MARK} look at the file.\n</think>\n\nReading it.\n\n"
        + call("editor", command="view", path="/workspace/greet.py"),
        call("editor", command="create", path="/workspace/new.py", file_text=BODY),
        call("shell", command="seq 1 20000"),
        FINISH,
    ]
    emitted: list = []
    result, events = await run_agent(repo, tmp_path, turns, subscriber=emitted.append)
    assert result.submitted
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    assert events == [e for e in emitted if not isinstance(e, STREAM_EVENTS)]  # deltas, blocks, output pieces
    assert any(isinstance(e, ModelDelta) for e in emitted) and any(isinstance(e, ToolOutput) for e in emitted)

    # The reasoning is in the raw turn only (not in the deltas, the parsed turn or the message).
    assert count(trajectory, MARK) == 1
    # The created file: in the raw turn, the editor's result (its text and diff) and the patch; not
    # again in the parsed calls, the call's start or Done.
    assert count(trajectory, BODY) == 4
    # The shell's output once: not again in the model's head-and-tail of it, nor in the tool message.
    assert count(trajectory, "\n19999\n20000\n") == 1 and count(trajectory, "\n10000\n") == 1
    lines = [json.loads(line) for line in trajectory.read_text().splitlines()]
    assert sum(line.get("from") == "turn" for line in lines) == 4
    assert sum(line.get("from") == "call" for line in lines) == 4
    (shell,) = [e for e in events if isinstance(e, ToolCallFinished) and e.name == "shell"]
    assert shell.full_output == "".join(f"{i}\n" for i in range(1, 20001))
    assert (
        shell.output.startswith("1\n2\n")
        and "19999\n20000" in shell.output
        and "\n10000\n" not in shell.output
    )

    state = load_trajectory(trajectory)
    assert state.messages == [e.message for e in emitted if isinstance(e, MessageAdded)]
    assert state.patch == result.patch and "CREATED-FILE-BODY" in state.patch


async def test_the_stream_is_kept_on_request(repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "kept.jsonl"
    writer = TrajectoryWriter(path, keep_stream=True)
    emitted: list = []

    def both(event) -> None:
        emitted.append(event)
        writer(event)

    await run_agent(repo, tmp_path, ["<think>\nHm.\n</think>\n\n" + FINISH], subscriber=both)
    writer.close()
    assert read_events(path) == emitted and any(isinstance(e, ModelDelta) for e in emitted)


def test_messages_that_differ_from_their_turn_are_stored_whole(tmp_path: Path) -> None:
    """Only an exact copy becomes a reference; anything else (a front end's own message, a turn
    the loop changed) is written as it is."""
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    turn = ModelResponded(step=1, raw="<think>\nr\n</think>\n\nhello", content="hello", reasoning="r",
                          tool_calls=[], format_error=None, prompt_tokens=1, completion_tokens=1,
                          finish_reason="stop")  # fmt: skip
    same = MessageAdded(message={"role": "assistant", "content": "hello", "reasoning_content": "r"})
    other = MessageAdded(message={"role": "assistant", "content": "hello!", "reasoning_content": "r"})
    for event in (turn, same, other):
        writer(event)
    writer.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "content" not in lines[0] and lines[0]["content_span"] == [20, 25]
    assert lines[1]["from"] == "turn" and "message" not in lines[1]
    assert lines[2]["message"]["content"] == "hello!"
    assert read_events(path) == [turn, same, other]


def test_a_reference_to_nothing_is_a_damaged_trajectory(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"type": "message_added", "time": 1, "from": "call", "call_id": "c9"}\n{"type": "done"}\n'
    )
    with pytest.raises(TrajectoryError, match=r"t.jsonl:1: not a trajectory event \(KeyError"):
        read_events(path)


def test_outputs_cut_from_their_full_output_read_back_exactly(tmp_path: Path) -> None:
    """Random outputs made of a full output's head, a note, its tail and a note after (and some
    that are not): every one reads back as written, stored once where it can be."""
    rng = random.Random(7)

    def text(alphabet: str, most: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))

    events = []
    for i in range(400):
        full = text("ab\n", 300)
        head, tail = sorted(rng.randint(0, len(full)) for _ in range(2))
        output = full[:head] + text("abx", 6) + full[tail:] + text("abx", 6)
        if i % 5 == 0:
            output = text("ab\n", 60)
        events.append(ToolCallFinished(step=i, call_id=f"c{i}", name="shell", output=output, is_error=False,
                                       full_output=full))  # fmt: skip
    path = tmp_path / "t.jsonl"
    writer = TrajectoryWriter(path)
    for event in events:
        writer(event)
    writer.close()
    assert read_events(path) == events
    assert '"output_from_full"' in path.read_text()
