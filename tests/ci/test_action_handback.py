"""The action's other ways of handing a verified fix back (action/clover_github.py): a review
comment's fix as a reply with a ``suggestion`` block, and a failed CI run's fix as a check run.
The end-to-end review run goes through the real workflow and bot (Docker); the edge cases drive
``publish`` itself on a real checkout and a patch git made, against the stand-in REST API."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ci.actions_runner import FakeGitHub
from tests.ci.test_action import REPLAY, REPO, branch_log, check_progress, run_workflow, server_repo, step
from tests.git_repos import git

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "action" / "clover_github.py"
_spec = importlib.util.spec_from_file_location("clover_github", SCRIPT)
assert _spec is not None and _spec.loader is not None
clover_github = sys.modules.setdefault("clover_github", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(clover_github)

OLD = "".join(f"line {n}\n" for n in range(1, 11))


def diff_of(tmp_path: Path, files: dict[str, str], changed: dict[str, str | None]) -> str:
    """The patch git makes for ``changed`` (None: deleted) over ``files``."""
    repo = tmp_path / "diffrepo"
    repo.mkdir(parents=True)
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    for name, text in changed.items():
        if text is None:
            (repo / name).unlink()
        else:
            (repo / name).write_text(text)
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--binary")


def replace_lines(text: str, first: int, last: int, new: list[str]) -> str:
    lines = text.splitlines()
    return "\n".join([*lines[: first - 1], *new, *lines[last:]]) + "\n"


@pytest.mark.parametrize(
    ("start", "end", "change", "expected"),
    [
        (4, 4, (4, 4, ["LINE 4"]), "LINE 4"),
        (3, 5, (4, 4, ["four", "four and a half"]), "line 3\nfour\nfour and a half\nline 5"),
        (4, 6, (5, 6, []), "line 4"),  # lines deleted inside the range
        (4, 4, (5, 4, ["after 4"]), "line 4\nafter 4"),  # an insertion right after the last line
        (4, 4, (5, 5, ["LINE 5"]), None),  # a change next to the commented line, not on it
        (4, 4, (1, 1, ["LINE 1"]), None),  # far from it
    ],
)
def test_a_suggestion_is_what_the_commented_lines_become(
    tmp_path: Path, start: int, end: int, change: tuple[int, int, list[str]], expected: str | None
) -> None:
    patch = diff_of(tmp_path, {"f.txt": OLD}, {"f.txt": replace_lines(OLD, *change)})
    assert clover_github.suggestion(patch, "f.txt", start, end, OLD) == expected


def test_a_fix_that_a_suggestion_cannot_carry_is_refused(tmp_path: Path) -> None:
    two = diff_of(
        tmp_path / "a", {"f.txt": OLD, "g.txt": OLD}, {"f.txt": OLD.replace("line 4", "L4"), "g.txt": "x\n"}
    )
    new_file = diff_of(
        tmp_path / "b", {"f.txt": OLD}, {"f.txt": OLD.replace("line 4", "L4"), "n.txt": "new\n"}
    )
    no_newline = diff_of(tmp_path / "c", {"f.txt": OLD}, {"f.txt": OLD.replace("line 4", "L4").rstrip("\n")})
    for patch in (two, new_file, no_newline):
        assert clover_github.suggestion(patch, "f.txt", 1, 10, OLD) is None, patch
    # the patch is not against the file as it is at the head (a stale comment)
    fine = diff_of(tmp_path / "d", {"f.txt": OLD}, {"f.txt": OLD.replace("line 4", "L4")})
    assert clover_github.suggestion(fine, "f.txt", 4, 4, OLD.replace("line 3", "moved")) is None
    assert clover_github.suggestion(fine, "f.txt", 4, 4, OLD) == "L4"


def test_removed_lines_that_look_like_file_headers_stay_in_the_hunk(tmp_path: Path) -> None:
    old = "a\n-- x\n++ y\nb\n"
    patch = diff_of(tmp_path, {"f.sql": old}, {"f.sql": "a\n-- z\n++ w\nb\n"})
    assert "\n--- x\n" in patch and "\n+++ w\n" in patch
    assert clover_github.suggestion(patch, "f.sql", 2, 3, old) == "-- z\n++ w"


# --- publish on a real checkout -------------------------------------------------------------


def publish(
    tmp_path: Path, github: FakeGitHub, decision: dict[str, Any], patch: str, *extra: str, link: bool = False
) -> subprocess.CompletedProcess[str]:
    """``clover_github.py publish`` in a checkout of the calculator, as the action's step runs it;
    ``link``: the checkout's link.py is a link to a file outside it (the calculator's text)."""
    bare = server_repo(tmp_path)
    work = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    if link:
        outside = tmp_path / "outside.py"
        outside.write_text((work / "calculator.py").read_text())
        (work / "link.py").symlink_to(outside)
    out = tmp_path / "out"
    out.mkdir()
    (out / "patch.diff").write_text(patch)
    (out / "summary.md").write_text("the bot's report\n")
    result = {
        "exit_code": 0,
        "status": "fixed",
        "verdict": "fixed",
        "files_changed": ["calculator.py"],
        "tests": {"target_before": {"failed": 1}, "target_after": {"passed": 1}},
    }
    (out / "result.json").write_text(json.dumps(result))
    state = tmp_path / "decision.json"
    base = {
        k: "" for k in ("kind", "number", "ref", "base", "branch", "pr_url", "head_sha", "comment_id", "path")
    }
    state.write_text(json.dumps({**base, "continue_branch": False, "start_line": 0, "line": 0, **decision}))
    env = {
        **os.environ,
        "GITHUB_API_URL": github.url,
        "GITHUB_TOKEN": "test-token",
        "GITHUB_REPOSITORY": REPO,
        "GITHUB_SERVER_URL": f"file://{tmp_path / 'server'}",
        "GITHUB_RUN_ID": "777",
        "GITHUB_OUTPUT": str(tmp_path / "outputs"),
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), "publish", "--state", str(state), "--out", str(out), *extra],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def calculator_fix(tmp_path: Path, name: str = "calculator.py") -> str:
    text = (ROOT / "examples" / "calculator" / "calculator.py").read_text()
    return diff_of(tmp_path / "fix", {name: text}, {name: text.replace("return a - b", "return a + b", 1)})


def outputs(tmp_path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp_path / "outputs").read_text().splitlines())


def test_a_failed_ci_runs_fix_can_be_a_check_run_with_nothing_pushed(tmp_path: Path) -> None:
    github = FakeGitHub(REPO)
    try:
        sha = "ab" * 20
        decision = {
            "kind": "ci-failure",
            "base": "main",
            "branch": f"clover/ci-{sha[:12]}-777",
            "head_sha": sha,
        }
        proc = publish(
            tmp_path, github, decision, calculator_fix(tmp_path), "--ci-failure-output", "check-run"
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (check,) = github.check_runs
        assert (
            check["head_sha"] == sha and check["conclusion"] == "neutral" and check["status"] == "completed"
        )
        ((note),) = check["output"]["annotations"]
        assert note["path"] == "calculator.py" and note["start_line"] <= 6 <= note["end_line"]
        assert (
            "+    return a + b" in check["output"]["text"] and "verdict `fixed`" in check["output"]["summary"]
        )
        assert github.created_pulls == [] and outputs(tmp_path)["hand-back-url"] == check["html_url"]
        assert (
            git(tmp_path / "server" / f"{REPO}.git", "branch", "--list", "clover/*") == ""
        )  # nothing pushed
    finally:
        github.close()


def review_decision(line: int, path: str = "calculator.py", start: int = 0) -> dict[str, Any]:
    pulls_branch = "feature"
    return {
        "kind": "review-comment", "number": "12", "ref": pulls_branch, "base": pulls_branch,
        "branch": "clover/pr-12-777", "comment_id": "901", "path": path, "start_line": start or line, "line": line,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("decision", "why"),
    [
        (review_decision(9), "the fix is not on the commented line"),
        (review_decision(0), "an outdated comment: no line"),
        (review_decision(6, path="link.py"), "the commented path is a link in the checkout"),
    ],
)
def test_a_review_fix_that_does_not_fit_the_comment_goes_to_a_pull_request(
    tmp_path: Path, decision: dict[str, Any], why: str
) -> None:
    github = FakeGitHub(REPO)
    try:
        path = decision["path"]
        proc = publish(tmp_path, github, decision, calculator_fix(tmp_path, path), link=path == "link.py")
        assert github.replies == [] and "goes beyond the commented lines" in proc.stdout, why
        if path == "link.py":  # git refuses the patch over a link too: nothing handed back
            assert proc.returncode == 1 and github.created_pulls == []
            return
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (pull,) = github.created_pulls
        assert pull["head"] == "clover/pr-12-777" and pull["base"] == "feature"
    finally:
        github.close()


def test_review_fix_pull_request_always_opens_one(tmp_path: Path) -> None:
    github = FakeGitHub(REPO)
    try:
        proc = publish(
            tmp_path, github, review_decision(6), calculator_fix(tmp_path), "--review-fix", "pull-request"
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert github.replies == [] and len(github.created_pulls) == 1
    finally:
        github.close()


# --- end to end: the workflow, the bot in Docker, the reply -----------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_a_review_comment_gets_its_verified_fix_as_a_suggestion(tmp_path: Path) -> None:
    github = FakeGitHub(REPO, permissions={"alice": "write"})
    try:
        bare = server_repo(tmp_path)
        git(bare, "branch", "feature", "main")
        sha = git(bare, "rev-parse", "feature").strip()
        github.pulls[12] = {
            "number": 12,
            "title": "add things",
            "body": "",
            "head": {"ref": "feature", "sha": sha, "repo": {"full_name": REPO}},
            "base": {"ref": "main"},
        }
        user = {"login": "alice", "type": "User"}
        event = {
            "action": "created",
            "comment": {
                "id": 901, "body": "@clover-agent add subtracts here", "user": user, "path": "calculator.py",
                "line": 6, "side": "RIGHT", "diff_hunk": "@@ -4,3 +4,3 @@\n     return a - b",
            },
            "pull_request": {"number": 12, "title": "add things", "body": ""},
            "sender": user,
            "repository": {"full_name": REPO, "default_branch": "main"},
        }  # fmt: skip
        runner, outs = run_workflow(
            tmp_path,
            github,
            "clover.yml",
            "pull_request_review_comment",
            event,
            extra_with={"replay": str(REPLAY)},
        )
        assert outs is not None and outs["exit-code"] == "0", step(runner, "Run the bot").output
        (reply,) = github.replies
        assert reply["pull"] == 12 and reply["in_reply_to"] == 901
        assert "```suggestion\n    return a + b\n```" in reply["body"] and "verdict `fixed`" in reply["body"]
        assert github.created_pulls == [] and outs["hand-back-url"] == reply["html_url"]
        assert branch_log(bare, "feature") == ["calculator with a bug"]  # nothing pushed
        check_progress(github, 12, reply["html_url"])
    finally:
        github.close()
