"""What goes wrong is said in the transcript, and the app stays usable: a denied call, a sandbox
that cannot start, a backend that cannot start; and copying text, switching the theme."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import ApprovalDecided, Done, ToolCallFinished
from clover_agent.session.assembly import SessionConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.help import HelpScreen
from clover_agent.tui.widgets.notice import NoticeLine
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay


def _notices(app: CloverApp) -> str:
    return "\n".join(n.text for n in app.query(NoticeLine))


@pytest.mark.slow
async def test_a_denied_call_is_reported_to_the_model(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="rm -rf /workspace/tests")),
            turn("", call("finish", summary="left them")),
        ],
    )
    app = make_app(repo, replay, policy="ask")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "clean up")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
        await pilot.press("n")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the end")
        decided = next(e for e in app.events if isinstance(e, ApprovalDecided))
        assert (decided.approved, decided.decided_by) == (False, "user")
        result = next(e for e in app.events if isinstance(e, ToolCallFinished))
        assert result.is_error and "was not allowed" in result.output
        assert "denied by user" in str(app.transcript.cards[0]._status.render())
        assert app.session.run(app.session.diff()).result(timeout=60) == ""  # nothing was removed
        await pilot.press("ctrl+q")


@pytest.mark.docker
async def test_a_sandbox_that_cannot_start(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="never"))])
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        sandbox_kind="docker",
        spec=sandbox_spec(repo, image="clover-agent-no-such-image:never"),
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status_bar.sandbox == "failed", "the failed start")
        assert "The docker sandbox did not start" in _notices(app)
        await send(pilot, "anything")
        await wait_for(pilot, lambda: "the session cannot work" in _notices(app), "the refusal")
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_backend_that_cannot_start(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    app = make_app(repo, tmp_path / "missing.jsonl")  # the replay file is not there
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: "The model backend cannot start" in _notices(app), "the report")
        assert "missing.jsonl" in _notices(app)
        await send(pilot, "anything")
        await wait_for(pilot, lambda: "the session cannot work" in _notices(app), "the refusal")
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_copy_the_selection_and_switch_the_theme(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    app = make_app(repo, write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(80, 24)) as pilot:
        app.prompt.load_text("some words to copy")
        app.prompt.select_all()
        await pilot.press("ctrl+c")  # with a selection: copy, not quit
        assert app.clipboard == "some words to copy" and app.is_running
        assert app.current_theme.dark
        await pilot.press("f2")
        assert not app.current_theme.dark
        await pilot.press("f2")
        assert app.current_theme.dark
        app.prompt.move_cursor(app.prompt.document.end)  # the selection is gone, the text stays
        await pilot.press("ctrl+c")  # nothing selected, a prompt with text: cleared
        assert app.prompt.text == "" and app.is_running
        await pilot.press("ctrl+c", "ctrl+c")  # an empty prompt, idle: twice quits
        await wait_for(pilot, lambda: not app.is_running, "the app to quit")


@pytest.mark.slow
async def test_the_app_answers_while_the_sandbox_starts(tmp_path: Path) -> None:
    """A set-up command holds the sandbox's start; meanwhile the app takes keys and a request,
    which runs once the sandbox is ready."""
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "go"
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="ran after the start"))])
    setup = f"while [ ! -e {gate} ]; do sleep 0.1; done"  # the test decides when the start ends
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        sandbox_kind="local",
        spec=sandbox_spec(repo, setup_commands=[setup]),
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status_bar.sandbox == "starting", "the start")
        await send(pilot, "do it")
        await wait_for(pilot, lambda: "Waiting for the sandbox to start…" in _notices(app), "the wait notice")
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)  # the UI answers while the sandbox starts
        await pilot.press("escape")
        assert app.status_bar.sandbox == "starting" and not any(isinstance(e, Done) for e in app.events)
        gate.touch()
        await wait_for(
            pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request after the start"
        )
        assert "ran after the start" in _notices(app)
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_failed_sandbox_start_can_be_retried(tmp_path: Path) -> None:
    """A set-up command that fails until a file exists: the start fails and says how to go on;
    ``/sandbox retry`` starts it again, without leaving the app, and the request then runs."""
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "ready-now"
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="ran after the retry"))])
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        sandbox_kind="local",
        spec=sandbox_spec(repo, setup_commands=[f"test -e {gate}"]),
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status_bar.sandbox == "failed", "the failed start")
        assert "/sandbox retry tries again" in _notices(app)
        await send(pilot, "/sandbox retry")  # still failing: said again, still usable
        await wait_for(
            pilot, lambda: _notices(app).count("/sandbox retry tries again") == 2, "the second failure"
        )
        gate.touch()
        await send(pilot, "/sandbox retry")
        await wait_for(pilot, lambda: app.status_bar.sandbox == "ready", "the retried start")
        await send(pilot, "/sandbox retry")
        await wait_for(pilot, lambda: "is up already" in _notices(app), "the refusal")
        await send(pilot, "go")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
        assert "ran after the retry" in _notices(app)
        await pilot.press("ctrl+q")


@pytest.mark.docker
async def test_a_failed_docker_start_can_switch_to_the_local_sandbox(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="ran locally"))])
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        sandbox_kind="docker",
        spec=sandbox_spec(repo, image="clover-agent-no-such-image:never"),
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.status_bar.sandbox == "failed", "the failed start")
        assert "/sandbox local uses the local sandbox (no isolation" in _notices(app)  # said before
        await send(pilot, "/sandbox local")
        await wait_for(pilot, lambda: app.status_bar.sandbox == "ready", "the local sandbox")
        assert app.status_bar.sandbox_kind == "local"
        assert "local sandbox (no isolation)" in _notices(app)  # with its warning
        await send(pilot, "go")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
        assert "ran locally" in _notices(app)
        await pilot.press("ctrl+q")
