"""``fix --plan``: the agent looks first, under the read-only plan policy, and its plan is printed;
the run stops there with nothing changed, or with ``--yes`` the plan is approved and carried out
(and the patch applied as ``--yes`` always does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs
from tests.clover_agent.test_agent_loop import call

pytestmark = pytest.mark.slow

BUGGY = "    return a - b"
FIXED = "    return a + b"
EDIT = call(
    "editor",
    command="str_replace",
    path="/workspace/calculator.py",
    old_str='    """Return the sum of a and b."""\n' + BUGGY,
    new_str='    """Return the sum of a and b."""\n' + FIXED,
)
PROPOSE = call(
    "propose_plan",
    summary="`add` subtracts; make it add.",
    steps=json.dumps(["Replace `a - b` with `a + b` in add()", "Run the whole suite"]),
    files=json.dumps(["calculator.py"]),
    checks=json.dumps(["tests/test_calculator.py::test_add passes", "no other test fails"]),
)
STEPS = ["Replace `a - b` with `a + b` in add()", "Run the whole suite"]


def progress(*statuses: str) -> str:
    return call(
        "update_plan",
        steps=json.dumps([{"step": s, "status": t} for s, t in zip(STEPS, statuses, strict=True)]),
    )


def write_replay(path: Path, *turns: str) -> Path:
    path.write_text("".join(json.dumps({"content": t}) + "\n" for t in turns))
    return path


def trajectory(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]


def test_fix_plan_prints_the_plan_and_stops_with_nothing_changed(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "plan.jsonl",
        call("editor", command="view", path="/workspace/calculator.py"),
        EDIT,  # refused: plan mode
        call("shell", command="sed -i 's/a - b/a + b/' /workspace/calculator.py"),  # refused too
        PROPOSE,
    )
    code = main(
        ["fix", "test_add", "--plan", "--repo", str(repo), "--sandbox", "local", "--replay", str(replay)]
    )
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, out + err
    assert "plan proposed:" in out
    assert "1. [ ] Replace `a - b` with `a + b` in add()" in out and "- calculator.py" in out
    assert "nothing was changed" in out and "--plan" in out and "--yes" in out  # how to carry it out
    assert BUGGY in (repo / "calculator.py").read_text()
    (run,) = run_dirs(repo)
    events = trajectory(run)
    refused = [e["output"] for e in events if e["type"] == "tool_call_finished"][1:3]
    assert all("not allowed" in text and "'plan'" in text for text in refused), refused
    done = [e for e in events if e["type"] == "done"][-1]
    assert done["outcome"] == "planned" and done["plan"]["files"] == ["calculator.py"]
    assert not (run / "patch.diff").exists() or not (run / "patch.diff").read_text().strip()


def test_fix_plan_yes_approves_the_plan_and_carries_it_out(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "go.jsonl",
        EDIT,  # refused: still planning
        PROPOSE,
        progress("in_progress", "pending"),
        EDIT,  # allowed now
        progress("completed", "in_progress"),
        call("run_tests"),
        progress("completed", "completed"),
        call("finish", summary="add() adds; the suite passes."),
    )
    code = main(
        [
            "fix",
            "test_add",
            "--plan",
            "--yes",
            "--repo",
            str(repo),
            "--sandbox",
            "local",
            "--replay",
            str(replay),
        ]
    )
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, out + err
    assert "plan proposed:" in out and "plan approved: 2 steps" in out
    assert "plan: 1/2 done; now: Run the whole suite" in out and "plan: 2/2 done" in out
    assert FIXED in (repo / "calculator.py").read_text()
    (run,) = run_dirs(repo)
    events = trajectory(run)
    stages = [e["stage"] for e in events if e["type"] == "plan_updated"]
    assert stages == ["proposed", "approved", "progress", "progress", "progress"]
    approved = next(
        e
        for e in events
        if e["type"] == "message_added" and "approved this plan" in str(e.get("message", ""))
    )
    assert "Replace `a - b`" in approved["message"]["content"]  # the plan is in the conversation
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "fixed"


def test_fix_plan_cannot_resume(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "--resume", "last", "--plan", "--repo", str(repo)])
    assert code == ExitCode.USAGE
    assert "--plan starts a new run" in capsys.readouterr().err
