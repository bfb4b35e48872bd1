"""The prompt (multi-line, history, @path completion), folding and thinking, per-file rejection in
/apply, /tests, /policy, /export and /help, driven through the app with keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.events import Done, TestsRun
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.help import HelpScreen
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.path_menu import PathMenu
from clover_agent.tui.widgets.results_table import TestTable
from clover_agent.tui.widgets.thinking import Thinking
from clover_agent.tui.widgets.user_message import UserMessage
from tests.tui.helpers import FIX_ADD, calculator_repo, call, make_app, send, turn, wait_for, write_replay


def _done(app: CloverApp, count: int = 1) -> bool:
    return sum(isinstance(e, Done) for e in app.events) >= count


def _notices(app: CloverApp) -> str:
    return "\n".join(n.text for n in app.query(NoticeLine))


@pytest.mark.slow
async def test_prompt_lines_history_and_path_completion(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [turn("", call("finish", summary="one")), turn("", call("finish", summary="two"))],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.prompt
        await wait_for(pilot, lambda: prompt.files, "the repository's files")
        await pilot.press(*"look at @calc")
        menu = app.query_one(PathMenu)
        assert menu.is_open and menu.chosen == "calculator.py"
        await pilot.press("tab")
        assert prompt.text == "look at @calculator.py " and not menu.is_open
        await pilot.press("ctrl+j", *"and the tests")
        assert prompt.text == "look at @calculator.py \nand the tests"  # a second line, not sent
        await pilot.press("enter")
        await wait_for(pilot, lambda: _done(app), "the first request")
        assert [m.text for m in app.query(UserMessage)] == ["look at @calculator.py \nand the tests"]
        users = [m["content"] for m in app.session.agent.messages if m["role"] == "user"]
        assert users[-1] == "look at /workspace/calculator.py \nand the tests"  # the mention: a sandbox path

        await send(pilot, "and @nothing-such.py")  # not a file: left as typed
        await wait_for(pilot, lambda: _done(app, 2), "the second request")
        users = [m["content"] for m in app.session.agent.messages if m["role"] == "user"]
        assert users[-1] == "and @nothing-such.py"

        assert prompt.text == ""
        await pilot.press("up")
        assert prompt.text == "and @nothing-such.py"
        await pilot.press("up")
        assert prompt.text == "look at @calculator.py \nand the tests"
        await pilot.press("down", "down")  # the cursor is on the last line: down walks forward
        assert prompt.text == ""
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_folding_thinking_rejecting_a_file_tests_policy_export_help(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    notes = call("editor", command="create", path="/workspace/NOTES.md", file_text="agent notes\n")
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="seq 1 40"), think="Count first."),
            turn("", FIX_ADD, notes),
            turn("", call("finish", summary="fixed add and wrote notes")),
        ],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "go")
        await wait_for(pilot, lambda: _done(app), "the request")

        shell = app.transcript.cards[0]
        assert shell.foldable and shell.folded
        shell.focus()
        await pilot.press("enter")
        assert not shell.folded  # the whole output
        await pilot.press("ctrl+o")
        assert shell.folded

        thinking = app.query_one(Thinking)
        assert thinking.collapsed  # folded once the turn completed
        await pilot.press("ctrl+t")
        assert not thinking.collapsed
        await pilot.press("ctrl+t")
        assert thinking.collapsed

        # /apply: reject NOTES.md, accept calculator.py
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyScreen), "the apply dialog")
        paths = [c.path for c in app.screen.changes]
        assert paths == ["NOTES.md", "calculator.py"]
        await pilot.press("space")  # the highlighted (first) file: rejected
        await pilot.press("enter")
        # the part left is judged on its own and offered again, with its own verdict
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ApplyScreen) and len(app.screen.changes) == 1,
            "the part's dialog",
            deadline_s=300,
        )
        assert [c.path for c in app.screen.changes] == ["calculator.py"]
        assert app.screen.verdict.startswith("fixed: "), app.screen.verdict
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: "return a + b" in (repo / "calculator.py").read_text(), "the accepted file"
        )
        assert not (repo / "NOTES.md").exists()

        await send(pilot, "/tests tests/test_calculator.py")
        await wait_for(
            pilot,
            lambda: any(isinstance(e, TestsRun) and e.phase == "user" for e in app.events),
            "the test run",
        )
        report = next(e for e in app.events if isinstance(e, TestsRun) and e.phase == "user").report
        assert report["failed"] == 0 and report["passed"] >= 1  # the sandbox has the fix
        # The transcript mounts the table when it handles the event, after the event is recorded.
        await wait_for(pilot, lambda: app.query(TestTable), "the test table")

        await send(pilot, "/policy read-only")
        await wait_for(pilot, lambda: "Policy is now read-only." in _notices(app), "the policy change")
        assert app.session.agent.policy.name == "read-only"
        await send(pilot, "/policy nonsense")
        await wait_for(pilot, lambda: "unknown policy 'nonsense'" in _notices(app), "the refusal")

        target = tmp_path / "transcript.md"
        await send(pilot, f"/export {target}")
        await wait_for(pilot, target.exists, "the export")
        markdown = target.read_text()
        assert (
            "## Request 1\n\ngo" in markdown
            and "**shell**" in markdown
            and "fixed add and wrote notes" in markdown
        )

        await send(pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await send(pilot, "/nope")
        assert "Unknown command /nope" in _notices(app)
        await pilot.press("ctrl+q")
