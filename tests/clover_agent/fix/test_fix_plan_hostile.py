"""A model that does not play by plan mode's rules under ``fix --plan`` (no ``--yes``): it tries
every way to change the workspace (an edit, an undo of one, a command, a test target that would
be an option) and then calls ``finish`` instead of proposing a plan. Nothing changes: the user's
tree is as it was, and the run's patch is empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.cli import main
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs
from tests.clover_agent.fix.test_fix_plan import BUGGY, EDIT, trajectory, write_replay
from tests.clover_agent.test_agent_loop import call
from tests.git_repos import git

pytestmark = pytest.mark.slow


def test_a_model_that_finishes_while_planning_changes_nothing(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "hostile.jsonl",
        EDIT,
        call("editor", command="undo_edit", path="/workspace/calculator.py"),
        call("editor", command="create", path="/workspace/conftest.py", file_text="import os\n"),
        call("shell", command="echo pwned > /workspace/pwned.txt"),
        call("run_tests", target="--basetemp=/workspace/calculator.py"),
        call("run_tests"),  # allowed: leaves nothing behind either
        call("search", pattern="x", path="/workspace", glob="--pre=touch"),
        call("finish", summary="Done, without a plan."),
    )
    main(["fix", "test_add", "--plan", "--repo", str(repo), "--sandbox", "local", "--replay", str(replay)])
    capsys.readouterr()
    assert BUGGY in (repo / "calculator.py").read_text()
    assert git(repo, "status", "--porcelain", "--ignored").strip() in ("", "!! .clover/")
    (run,) = run_dirs(repo)
    outputs = [e for e in trajectory(run) if e["type"] == "tool_call_finished"]
    assert all(e["is_error"] for e in outputs[:5]), [e["output"][:200] for e in outputs]
    assert not (run / "patch.diff").exists() or not (run / "patch.diff").read_text().strip()
