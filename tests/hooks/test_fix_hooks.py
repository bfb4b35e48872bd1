"""Hooks through ``clover-agent fix``: the user's settings file holds them, the command runs as a
user runs it (a separate process, the local sandbox, replayed turns, real hook scripts), and a
repository's hooks run only once the user trusts its file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.agent.trajectory import read_events
from clover_agent.events import HookRan
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo, run_dirs
from tests.git_repos import git
from tests.hooks.scripts import CLAUDE_DENYLIST, logged, recorder, script

pytestmark = pytest.mark.slow

RM = json.dumps(
    {
        "content": "<tool_call>\n<function=shell>\n<parameter=command>\nrm -rf /workspace/tests\n</parameter>\n"
        "</function>\n</tool_call>"
    }
)


def fix(
    repo: Path, tmp_path: Path, replay: Path, *extra: str, config: str = ""
) -> subprocess.CompletedProcess[str]:
    """``clover-agent fix test_add`` (``--yes`` unless ``extra`` says otherwise) with the settings file ``config`` and a state folder of its own."""
    settings = tmp_path / "config.toml"
    settings.write_text(config)
    env = {**os.environ, "CLOVER_CONFIG": str(settings), "CLOVER_STATE": str(tmp_path / "state")}
    return subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--backend", "replay",
         "--replay", str(replay), "--sandbox", "local", *(extra or ("--yes",))],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip


def test_fix_runs_the_users_hooks_a_deny_reaches_the_model_and_a_veto_keeps_the_tree(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    hooks = tmp_path / "hooks"
    denylist = script(hooks, "deny-rm.sh", CLAUDE_DENYLIST)
    starts = tmp_path / "start.jsonl"
    start = recorder(hooks, "start.sh", starts, "echo 'Hooks are on in this run.'\n")
    veto = script(hooks, "veto.sh", "cat > /dev/null\necho 'frozen: no changes land today' >&2\nexit 2\n")
    replay = tmp_path / "replay.jsonl"
    replay.write_text(RM + "\n" + REPLAY.read_text())
    config = f"""
[[hooks.PreToolUse]]
matcher = "Bash"
command = "{denylist}"

[[hooks.SessionStart]]
command = "{start}"

[[hooks.PreHandBack]]
command = "{veto}"
"""
    proc = fix(repo, tmp_path, replay, config=config)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    assert proc.returncode == 1, out
    assert "FIXED" in proc.stdout  # the verdict stands; the veto only keeps it out of the tree
    assert "frozen: no changes land today" in out and "vetoed by PreHandBack hook" in out
    assert "hook: PreToolUse hook" in proc.stdout and "deny" in proc.stdout
    assert git(repo, "status", "--porcelain") == ""  # nothing applied
    run = run_dirs(repo)[-1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["hand_back"].startswith("refused: not applied: frozen: no changes land today")
    events = read_events(run / "trajectory.jsonl")
    ran = [e for e in events if isinstance(e, HookRan)]
    assert [(e.hook_event, e.decided) for e in ran] == [
        ("SessionStart", "context"),
        ("PreToolUse", "deny"),
        ("PreHandBack", "veto"),
    ]
    refused = next(e for e in events if e.type == "tool_call_finished" and e.name == "shell")
    assert "rm -rf is not allowed here" in refused.output
    system = next(e for e in events if e.type == "message_added" and e.message["role"] == "system")
    assert "Hooks are on in this run." in system.message["content"]
    assert logged(starts)[0]["source"] == "startup"


def test_a_repositorys_hooks_run_only_once_it_is_trusted(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    marker = tmp_path / "repo-hook-ran"
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text(f'[[hooks.SessionStart]]\ncommand = "touch {marker}"\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a hook")
    untrusted = fix(repo, tmp_path, REPLAY, "--dry-run")
    assert untrusted.returncode == 0, untrusted.stdout + untrusted.stderr
    assert not marker.exists()
    assert "hooks ignored" in untrusted.stderr
    settings = tmp_path / "config.toml"
    trust = subprocess.run(
        [sys.executable, "-m", "clover_agent", "trust", "--repo", str(repo)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "CLOVER_CONFIG": str(settings), "CLOVER_STATE": str(tmp_path / "state")},
    )  # fmt: skip
    assert trust.returncode == 0, trust.stderr
    assert "[hooks.SessionStart]" in trust.stdout and "run as commands on this machine" in trust.stdout
    trusted = fix(repo, tmp_path, REPLAY, "--dry-run")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert marker.exists()


def test_a_user_prompt_submit_hook_that_blocks_fixs_task_ends_it_before_the_model(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    screen = script(
        tmp_path / "hooks",
        "screen.sh",
        "cat > /dev/null\necho 'fix runs are paused for the release' >&2\nexit 2\n",
    )
    proc = fix(repo, tmp_path, REPLAY, config=f'[[hooks.UserPromptSubmit]]\ncommand = "{screen}"\n')
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    assert proc.returncode == 1, out
    assert "not sent to the model: fix runs are paused for the release" in out, out
    assert git(repo, "status", "--porcelain") == ""
    events = read_events(run_dirs(repo)[-1] / "trajectory.jsonl")
    assert not [e for e in events if e.type == "model_call_started"]  # no model call
    assert [(e.hook_event, e.decided) for e in events if isinstance(e, HookRan)] == [
        ("UserPromptSubmit", "block")
    ]
