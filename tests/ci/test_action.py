"""The action (action.yml) and the example workflows run for real: their ``run:`` blocks executed
with bash (:mod:`tests.ci.actions_runner`) on a GitHub event payload, with ``GITHUB_*`` variables
and a local HTTP server as GitHub's REST API (every call recorded), and a bare git repository as
the server's copy. The bot's step runs the real ``clover-agent ci`` with the replay backend
(recorded turns, not a model) in the Docker sandbox; the ``uses:`` steps of other actions are
stand-ins (checkout clones the bare repository; the environment cache restores this checkout's
virtual environment)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ci.actions_runner import FakeGitHub, Runner, Step, github_env, load_yaml
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo
from tests.git_repos import git

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/calc"
ACTION = load_yaml(ROOT / "action.yml")
SAND_IMAGE = "clover-agent-sandbox:latest"


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub(REPO, permissions={"alice": "write", "bob": "read", "mallory": "triage"})
    yield fake
    fake.close()


def server_repo(tmp_path: Path) -> Path:
    """The server's copy of acme/calc: the calculator with its bug on `main`."""
    work = calculator_repo(tmp_path)
    git(work, "branch", "-M", "main")
    bare = tmp_path / "server" / f"{REPO}.git"
    bare.parent.mkdir(parents=True)
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare


def stand_ins(extra_with: dict[str, str]) -> dict[str, Any]:
    def checkout(runner: Runner, name: str, inputs: dict[str, str], ctx: dict[str, Any]) -> Step:
        assert inputs["persist-credentials"] == "false"
        ws = Path(runner.env["GITHUB_WORKSPACE"])
        server = runner.env["GITHUB_SERVER_URL"].removeprefix("file://")
        git(ws.parent, "clone", "-q", f"{server}/{REPO}.git", str(ws))
        git(ws, "checkout", "-q", inputs["ref"])
        return Step(name, True)

    def cache(runner: Runner, name: str, inputs: dict[str, str], ctx: dict[str, Any]) -> Step:
        path = Path(inputs["path"])
        if path.name == "clover-venv":  # restored: this checkout's environment (clover-agent in it)
            path.symlink_to(Path(sys.executable).parents[1])
        return Step(name, True, outputs={"cache-hit": str(path.exists()).lower()})

    def nothing(runner: Runner, name: str, inputs: dict[str, str], ctx: dict[str, Any]) -> Step:
        return Step(name, True)

    def action(runner: Runner, name: str, inputs: dict[str, str], ctx: dict[str, Any]) -> Step:
        given = {**inputs, **extra_with}
        values = {k: given.get(k, str(v.get("default", ""))) for k, v in ACTION["inputs"].items()}
        inner = {**ctx, "inputs": {}, "steps": {}, "failed": False}
        inner["inputs"] = {k: (interp(v, inner) if "${{" in v else v) for k, v in values.items()}
        done = runner.run_steps(ACTION["runs"]["steps"], inner)
        outputs = {k: interp(v["value"], done) for k, v in ACTION["outputs"].items()}
        return Step(name, True, 1 if done.get("failed") else 0, outputs=outputs)

    return {
        "actions/checkout": checkout,
        "actions/setup-python": nothing,
        "actions/cache": cache,
        "actions/upload-artifact": nothing,
        "actions/download-artifact": nothing,
        "your-org/clover-agent": action,
    }


def interp(value: str, ctx: dict[str, Any]) -> str:
    from tests.ci.actions_runner import interpolate

    return interpolate(value, ctx)


def run_workflow(
    tmp_path: Path,
    fake: FakeGitHub,
    workflow: str,
    event_name: str,
    event: dict[str, Any],
    *,
    extra_with: dict[str, str] | None = None,
) -> tuple[Runner, dict[str, Any] | None]:
    """Run the job of ``clover_agent/ci/workflows/WORKFLOW`` for ``event``; (the runner, the action's
    outputs, or None when the job's condition skipped it)."""
    spec = load_yaml(ROOT / "clover_agent" / "ci" / "workflows" / workflow)
    assert event_name in spec["on"]
    (job,) = spec["jobs"].values()
    root = tmp_path / "runner"
    event_path = root / "event.json"
    event_path.parent.mkdir(parents=True)
    event_path.write_text(json.dumps(event))
    workspace = root / "work" / "calc"
    workspace.mkdir(parents=True)
    actor = str((event.get("sender") or {}).get("login", "someone"))
    env = github_env(
        root, workspace, event_name, event_path, fake.url, f"file://{tmp_path / 'server'}", REPO, actor, actor
    )
    runner = Runner(root, env, stand_ins({"image": SAND_IMAGE, **(extra_with or {})}))
    ctx: dict[str, Any] = {
        "github": {
            "token": "test-token",
            "action_path": str(ROOT),
            "event_name": event_name,
            "event": event,
            "repository": REPO,
            "run_id": "777",
            "run_attempt": "1",
        },
        "runner": {"temp": env["RUNNER_TEMP"]},
        "vars": {"CLOVER_BACKEND": "replay"},
        "secrets": {},
    }
    from tests.ci.actions_runner import condition

    if not condition(job.get("if"), ctx):
        return runner, None
    runner.run_steps(job["steps"], ctx)
    outputs = next(s for s in reversed(runner.log) if s.name.startswith("your-org/clover-agent")).outputs
    return runner, outputs


def comment_event(
    login: str, body: str, number: int = 7, *, kind: str = "User", pull: bool = False
) -> dict[str, Any]:
    issue: dict[str, Any] = {"number": number, "title": "add is wrong", "body": "add(2, 3) gives -1"}
    if pull:
        issue["pull_request"] = {"url": f"https://api.example/repos/{REPO}/pulls/{number}"}
    user = {"login": login, "type": kind}
    return {
        "action": "created",
        "comment": {"body": body, "user": user},
        "issue": issue,
        "sender": user,
        "repository": {"full_name": REPO, "default_branch": "main"},
    }


def step(runner: Runner, name: str) -> Step:
    return next(s for s in runner.log if s.name == name)


def ran(runner: Runner) -> list[str]:
    return [s.name for s in runner.log if s.ran]


def posted(fake: FakeGitHub) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in fake.calls if m != "GET"]


# --- who may start it (fast: nothing past the decision runs) ------------------------------------


@pytest.mark.parametrize(
    ("login", "kind", "asked"),
    [
        ("bob", "User", True),  # read access
        ("mallory", "User", True),  # triage: not write
        ("stranger", "User", True),  # not a collaborator (404)
        ("renovate[bot]", "Bot", False),  # a bot not in allowed-bots: the API is not asked
    ],
)
def test_a_comment_by_someone_without_write_access_starts_nothing(
    tmp_path: Path, github: FakeGitHub, login: str, kind: str, asked: bool
) -> None:
    server_repo(tmp_path)
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover.yml",
        "issue_comment",
        comment_event(login, "@clover-agent fix it please", kind=kind),
    )
    assert outputs is not None and outputs["ran"] == "false"
    decide = step(runner, "Decide whether this event starts a run")
    assert decide.code == 0 and "does not run" in decide.output, decide.output
    assert ran(runner) == ["Decide whether this event starts a run", "your-org/clover-agent"]
    assert posted(github) == []
    permission_calls = [p for _, p, _ in github.calls if "/permission" in p]
    assert permission_calls == ([f"/repos/{REPO}/collaborators/{login}/permission"] if asked else [])


def test_a_github_app_as_labeller_is_refused_without_an_error(tmp_path: Path, github: FakeGitHub) -> None:
    server_repo(tmp_path)
    app = {"login": "triage-app[bot]", "type": "Bot"}
    event = {
        "action": "labeled",
        "label": {"name": "clover-fix"},
        "sender": app,
        "issue": {"number": 7, "title": "t", "body": "b"},
        "repository": {"full_name": REPO, "default_branch": "main"},
    }
    runner, outputs = run_workflow(tmp_path, github, "clover.yml", "issues", event)
    decide = step(runner, "Decide whether this event starts a run")
    assert decide.code == 0 and "triage-app[bot] is a bot not in allowed-bots" in decide.output
    assert outputs is not None and outputs["ran"] == "false" and github.calls == []


def test_a_comment_without_the_phrase_does_not_even_start_the_job(tmp_path: Path, github: FakeGitHub) -> None:
    server_repo(tmp_path)
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover.yml",
        "issue_comment",
        comment_event("alice", "thanks, clover-agent looks nice"),
    )
    assert outputs is None and runner.log == [] and github.calls == []


def ci_event(
    branch: str,
    sha: str,
    *,
    actor: str = "alice",
    triggering: str = "alice",
    event: str = "pull_request",
    pulls: int | None = 3,
) -> dict[str, Any]:
    return {
        "action": "completed",
        "sender": {"login": triggering, "type": "User"},
        "workflow_run": {
            "id": 42,
            "conclusion": "failure",
            "event": event,
            "head_branch": branch,
            "head_sha": sha,
            "html_url": f"https://github.example/{REPO}/actions/runs/42",
            "head_repository": {"full_name": REPO},
            "actor": {"login": actor, "type": "User"},
            "triggering_actor": {"login": triggering, "type": "User"},
            "pull_requests": [] if pulls is None else [{"number": pulls, "head": {"ref": branch}}],
        },
    }


def test_the_bots_own_branch_is_skipped(tmp_path: Path, github: FakeGitHub) -> None:
    server_repo(tmp_path)
    event = ci_event("clover/issue-7-1", "a" * 40)
    runner, outputs = run_workflow(tmp_path, github, "clover-ci-failure.yml", "workflow_run", event)
    assert outputs is None and runner.log == []  # the job's condition
    # The action checks it again on its own (a workflow without that condition).
    steps = [{"uses": "your-org/clover-agent@x", "name": "your-org/clover-agent"}]
    ctx = {
        "github": {"token": "test-token", "action_path": str(ROOT), "event": event, "run_id": "777"},
        "runner": {"temp": runner.env["RUNNER_TEMP"]},
        "vars": {},
        "secrets": {},
    }
    runner.run_steps(steps, ctx)
    decide = step(runner, "Decide whether this event starts a run")
    assert "clover/issue-7-1 is the bot's own branch" in decide.output and github.calls == []


@pytest.mark.parametrize(
    ("actor", "triggering", "refused"),
    [("alice", "bob", "triggering_actor: bob"), ("bob", "alice", "actor: bob")],
)
def test_a_ci_failure_needs_both_actors_with_write_access(
    tmp_path: Path, github: FakeGitHub, actor: str, triggering: str, refused: str
) -> None:
    server_repo(tmp_path)
    event = ci_event("feature", "b" * 40, actor=actor, triggering=triggering)
    runner, outputs = run_workflow(tmp_path, github, "clover-ci-failure.yml", "workflow_run", event)
    decide = step(runner, "Decide whether this event starts a run")
    assert outputs is not None and outputs["ran"] == "false"
    assert f"{refused} has read access, not write" in decide.output and posted(github) == []


def test_a_comment_on_a_forks_pull_request_starts_nothing(tmp_path: Path, github: FakeGitHub) -> None:
    server_repo(tmp_path)
    github.pulls[9] = {
        "number": 9,
        "head": {"ref": "main", "sha": "c" * 40, "repo": {"full_name": "eve/calc"}},
        "base": {"ref": "main"},
        "html_url": "https://github.example/pull/9",
    }
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover.yml",
        "issue_comment",
        comment_event("alice", "@clover-agent fix", 9, pull=True),
    )
    assert outputs is not None and outputs["ran"] == "false" and posted(github) == []
    assert "a pull request from a fork" in step(runner, "Decide whether this event starts a run").output


# --- runs (the real bot, in Docker) --------------------------------------------------------------


def check_progress(github: FakeGitHub, number: int, pr_url: str) -> str:
    """One progress comment on ``number``, created once and updated (ready, then done)."""
    creates = [c for c in github.calls if c[0] == "POST" and c[1].endswith("/comments")]
    assert [c[1] for c in creates] == [f"/repos/{REPO}/issues/{number}/comments"]
    ((cid, comment),) = github.comments.items()
    patches = [c[1] for c in github.calls if c[0] == "PATCH"]
    assert patches == [f"/repos/{REPO}/issues/comments/{cid}"] * 2 and comment["edits"] == 2
    body = comment["body"]
    assert "- [x] the bot's run finished" in body and "**Status:** `fixed` (exit 0), verdict `fixed`" in body
    assert "- tests before: 0 passed, 1 failed" in body and "- tests after: 1 passed, 0 failed" in body
    assert f"The verified fix: {pr_url}" in body and "actions/runs/777" in body
    return body


def branch_log(bare: Path, branch: str) -> list[str]:
    return git(bare, "log", "--format=%s", branch).splitlines()


@pytest.mark.docker
@pytest.mark.slow
def test_a_collaborators_comment_on_an_issue_opens_a_verified_pull_request(
    tmp_path: Path, github: FakeGitHub
) -> None:
    bare = server_repo(tmp_path)
    main_before = git(bare, "rev-parse", "main")
    # The image steps run too: the images are loaded or built, and saved for the cache.
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover.yml",
        "issue_comment",
        comment_event("alice", "@clover-agent please fix add"),
        extra_with={"image": "", "replay": str(REPLAY)},
    )
    assert outputs is not None, runner.log
    bot = step(runner, "Run the bot")
    assert bot.code == 0 and outputs["exit-code"] == "0" and outputs["status"] == "fixed", bot.output
    assert (
        Path(outputs["result-path"]).is_file() and "return a + b" in Path(outputs["patch-path"]).read_text()
    )
    assert (Path(runner.env["RUNNER_TEMP"]) / "clover-images" / "images.tar").stat().st_size > 0
    (pull,) = github.created_pulls
    assert pull["head"] == "clover/issue-7-777" and pull["base"] == "main" and pull["draft"] is True
    assert outputs["pr-url"] == pull["html_url"]
    assert branch_log(bare, "clover/issue-7-777") == ["clover-agent: a fix for #7", "calculator with a bug"]
    assert git(bare, "rev-parse", "main") == main_before
    assert "return a + b" in git(bare, "show", "clover/issue-7-777:calculator.py")
    check_progress(github, 7, pull["html_url"])
    # The request reached the bot through a file, with the phrase taken out.
    task = (Path(runner.env["RUNNER_TEMP"]) / "clover-state" / "task.md").read_text()
    assert "add(2, 3) gives -1" in task and "please fix add" in task and "@clover-agent" not in task


@pytest.mark.docker
@pytest.mark.slow
def test_a_second_comment_on_the_bots_pull_request_adds_a_commit(tmp_path: Path, github: FakeGitHub) -> None:
    bare = server_repo(tmp_path)
    git(bare, "branch", "clover/issue-7-1", "main")  # the bot's branch, add still wrong on it
    sha = git(bare, "rev-parse", "clover/issue-7-1").strip()
    url = f"https://github.example/{REPO}/pull/12"
    github.pulls[12] = {
        "number": 12,
        "head": {"ref": "clover/issue-7-1", "sha": sha, "repo": {"full_name": REPO}},
        "base": {"ref": "main"},
        "html_url": url,
    }
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover.yml",
        "issue_comment",
        comment_event("alice", "@clover-agent add is still wrong", 12, pull=True),
        extra_with={"replay": str(REPLAY)},
    )
    assert outputs is not None and outputs["exit-code"] == "0", step(runner, "Run the bot").output
    assert github.created_pulls == [] and outputs["pr-url"] == url
    assert branch_log(bare, "clover/issue-7-1") == ["clover-agent: a fix for #12", "calculator with a bug"]
    check_progress(github, 12, url)


@pytest.mark.docker
@pytest.mark.slow
def test_a_failing_pull_request_run_gets_a_stacked_pull_request(tmp_path: Path, github: FakeGitHub) -> None:
    bare = server_repo(tmp_path)
    git(bare, "branch", "feature", "main")
    sha = git(bare, "rev-parse", "feature").strip()
    runner, outputs = run_workflow(
        tmp_path,
        github,
        "clover-ci-failure.yml",
        "workflow_run",
        ci_event("feature", sha),
        extra_with={"replay": str(REPLAY)},
    )
    assert outputs is not None and outputs["exit-code"] == "0", step(runner, "Run the bot").output
    (pull,) = github.created_pulls
    branch = f"clover/ci-{sha[:12]}-777"
    assert pull["head"] == branch and pull["base"] == "feature"  # stacked on the pull request's branch
    assert (
        branch_log(bare, branch)[1:] == ["calculator with a bug"]
        and git(bare, "rev-parse", "feature").strip() == sha
    )
    check_progress(github, 3, pull["html_url"])
