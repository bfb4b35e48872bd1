"""Every ``.clover`` folder clover-agent writes comes from one guarded function: a repository that
commits ``.clover`` (or a folder or ``.gitignore`` in it) as a symlink cannot make run records or
TUI sessions land outside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clover_agent.agent.records import state_dir
from clover_agent.errors import UsageError
from clover_agent.fix.runs import runs_dir
from clover_agent.session.store import sessions_dir
from tests.cli_process import run_at_a_terminal
from tests.git_repos import make_repo


@pytest.mark.parametrize("make", [runs_dir, sessions_dir])
@pytest.mark.parametrize("where", [".clover", "folder", ".gitignore"])
def test_no_clover_folder_is_written_through_a_symlink(tmp_path: Path, make, where: str) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = "runs" if make is runs_dir else "sessions"
    if where == ".clover":
        (repo / ".clover").symlink_to(elsewhere)
    elif where == "folder":
        (repo / ".clover").mkdir()
        (repo / ".clover" / name).symlink_to(elsewhere)
    else:
        (repo / ".clover" / name).mkdir(parents=True)
        (repo / ".clover" / name / ".gitignore").symlink_to(elsewhere / "planted")  # dangling
    with pytest.raises(UsageError, match=r"symlink|not a plain file"):
        make(repo)
    assert list(elsewhere.iterdir()) == []


def test_the_folder_is_made_once_and_ignored_by_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"})
    folder = state_dir(repo, "runs", "run records")
    assert folder == repo / ".clover" / "runs" and state_dir(repo, "runs", "run records") == folder
    (folder / "x.json").write_text("{}")
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""


def test_the_tui_refuses_a_symlinked_clover_before_it_starts(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (repo / ".clover").symlink_to(elsewhere)
    replay = tmp_path / "replay.jsonl"
    replay.write_text('{"content": "hello"}\n')
    code, shown = run_at_a_terminal(
        ["tui", "--repo", str(repo), "--sandbox", "local", "--backend", "replay", "--replay", str(replay)],
        env={"NO_COLOR": "1"},
        timeout=120,
    )
    assert code == 2 and ".clover is a symlink" in shown and "Traceback" not in shown, shown
    assert list(elsewhere.iterdir()) == []
