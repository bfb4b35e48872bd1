"""``--json-events`` versions: version 2 adds reasoning, usage and file_change lines to version 1's;
version 1 is still written on request (``--json-events 1``), exactly its old lines, each valid
against its own schema (shipped beside the current one)."""

from __future__ import annotations

import io
import json

import pytest

from clover_agent.ci.events import EVENTS_VERSION, JsonEvents, events_validator
from clover_agent.events import ModelResponded, WorkspaceChanged
from tests.ci.ci_runs import run_ci
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo

PATCH = (
    "diff --git a/calculator.py b/calculator.py\n--- a/calculator.py\n+++ b/calculator.py\n@@ -1,2 +1,2 @@\n"
    "-    return a - b\n+    return a + b\n"
    "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    "diff --git a/old.py b/old.py\ndeleted file mode 100644\n--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-y = 2\n"
)


def _turn(step: int, reasoning: str | None) -> ModelResponded:
    return ModelResponded(step=step, raw="", content="text", reasoning=reasoning, tool_calls=[], format_error=None,
                          prompt_tokens=100 * step, completion_tokens=10, finish_reason="stop", seconds=1.5)  # fmt: skip


def _lines(version: int) -> list[dict]:
    out = io.StringIO()
    events = JsonEvents(out, version)
    for event in (
        _turn(1, "think first"),
        _turn(2, None),
        WorkspaceChanged(step=2, call_id="c1", patch=PATCH),
    ):
        events(event)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    validator = events_validator(version)
    for line in lines:
        validator.validate(line)
    return lines


def test_version_2_adds_reasoning_usage_and_file_changes() -> None:
    assert EVENTS_VERSION == 2
    lines = _lines(2)
    assert [line["type"] for line in lines] == ["reasoning", "turn", "usage", "turn", "usage", "file_change"]
    assert {line["v"] for line in lines} == {2}
    assert lines[0]["text"] == "think first" and lines[0]["step"] == 1
    assert [line["total_tokens"] for line in lines if line["type"] == "usage"] == [110, 320]
    assert all(line["cost"] is None for line in lines if line["type"] == "usage")
    change = lines[-1]
    assert change["files"] == [{"path": "calculator.py", "change": "modified"},
                               {"path": "new.py", "change": "added"}, {"path": "old.py", "change": "deleted"}]  # fmt: skip
    assert change["added_lines"] == 2 and change["removed_lines"] == 2 and change["call_id"] == "c1"


def test_version_1_is_still_written_and_valid() -> None:
    lines = _lines(1)
    assert [line["type"] for line in lines] == ["turn", "turn"] and {line["v"] for line in lines} == {1}
    with pytest.raises(Exception, match="is not valid"):  # a version 2 line is no version 1 line
        events_validator(1).validate({**_lines(2)[0], "v": 1})


@pytest.mark.slow
@pytest.mark.docker
def test_a_run_writes_the_version_asked_for(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    args = ("--task", "add is broken", "--target", "tests/test_calculator.py::test_add", "--backend", "replay",
            "--replay", str(REPLAY))  # fmt: skip
    run = run_ci(repo, tmp_path / "out", *args)  # --json-events: the current version
    kinds = [e["type"] for e in run.events]
    assert run.code == 0 and {e["v"] for e in run.events} == {2}
    assert kinds.count("reasoning") == 5 and kinds.count("usage") == 5
    assert "Reproduce the failure" in next(e["text"] for e in run.events if e["type"] == "reasoning")
    changes = [e for e in run.events if e["type"] == "file_change"]
    assert changes and changes[-1]["files"] == [{"path": "calculator.py", "change": "modified"}]
    usage = [e["total_tokens"] for e in run.events if e["type"] == "usage"]
    assert usage == sorted(usage) and usage[-1] == run.result["tokens"]
    old = run_ci(repo, tmp_path / "out1", *args, "--json-events", "1", json_events=False)
    assert old.code == 0
    lines = [json.loads(line) for line in old.stdout.splitlines()]
    assert {line["v"] for line in lines} == {1} and lines[-1]["type"] == "finished"
    assert {line["type"] for line in lines} <= {
        "run_started",
        "turn",
        "tool_call",
        "tool_result",
        "tests",
        "finished",
    }
    for line in lines:
        events_validator(1).validate(line)
