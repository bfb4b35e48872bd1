"""Hostile replies through the whole loop (replayed turns, the real tools, a real local sandbox): what
the parser reads is what runs. A file of examples quoting a hundred complete calls is written as it
is and none of them runs; a value that loses information is sent back to the model, never run."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.events import ErrorReported, ToolCallFinished
from clover_agent.protocol import format_tool_call
from tests.clover_agent.test_agent_loop import call, run_agent
from tests.git_repos import make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"notes.txt": "one\ntwo\n"})


async def test_quoted_calls_are_written_as_data_and_never_run(repo: Path, tmp_path: Path) -> None:
    quoted = "\n".join(
        f"Example {i}:\n" + format_tool_call("shell", {"command": f"touch /workspace/PWNED-{i}"})
        for i in range(100)
    )
    turns = [
        "Writing the examples.\n"
        + format_tool_call(
            "editor", {"command": "create", "path": "/workspace/examples.md", "file_text": quoted}
        )
        + "\n"
        + format_tool_call("editor", {"command": "create", "path": "/workspace/next.txt", "file_text": "x"}),
        call("shell", command="ls /workspace"),
        call("finish", summary="Wrote the examples."),
    ]
    result, events = await run_agent(repo, tmp_path, turns)
    assert result.submitted
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [e.name for e in finished] == ["editor", "editor", "shell", "finish"]
    listing = finished[2].output
    assert "examples.md" in listing and "next.txt" in listing and "PWNED" not in listing
    assert f"+{quoted.splitlines()[-1]}" in result.patch  # the file holds the examples as written
    assert result.patch.count("+<tool_call>") == 100


async def test_a_value_that_would_lose_information_goes_back_to_the_model(repo: Path, tmp_path: Path) -> None:
    turns = [
        call("editor", command="insert", path="/workspace/notes.txt", insert_line="1.5", new_str="half"),
        call("editor", command="insert", path="/workspace/notes.txt", insert_line="1", new_str="after one"),
        call("finish", summary="Inserted."),
    ]
    result, events = await run_agent(repo, tmp_path, turns)
    assert result.submitted
    (error,) = [e for e in events if isinstance(e, ErrorReported)]
    assert "invalid arguments for `editor` at `insert_line`: `1.5` is not a whole number" in error.message
    assert "+after one" in result.patch and "half" not in result.patch
