"""Whole requests through the app with the replay backend and a real sandbox (local and Docker):
streamed text, tool cards, approvals (once and always, with the diff before the write), /diff,
/apply file by file into the working tree, never over the user's own uncommitted edits."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.events import ApprovalDecided, Done, ToolCallFinished
from clover_agent.session.events import ApprovalNeeded
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.diff import DiffScreen
from clover_agent.tui.widgets.agent_text import AgentText
from clover_agent.tui.widgets.diff_view import DiffView
from clover_agent.tui.widgets.results_table import TestTable
from clover_agent.tui.widgets.thinking import Thinking
from tests.tui.helpers import FIX_ADD, calculator_repo, call, make_app, send, turn, wait_for, write_replay

SANDBOXES = ["local", pytest.param("docker", marks=pytest.mark.docker)]
SHELL = call("shell", command="python3 -c 'print(6 * 7)'")


def _done(app: CloverApp, count: int = 1) -> bool:
    return sum(isinstance(e, Done) for e in app.events) >= count


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_request_approvals_diff_and_apply(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl",
        [
            turn(
                "I will run the failing test first.",
                call("run_tests", target="tests/test_calculator.py::test_add"),
                think="The request names add; reproduce it.",
            ),
            turn("`add` subtracts; I will fix it.", FIX_ADD),
            turn("", SHELL),
            turn("", SHELL),  # the same command again: "always" covers it
            turn("", call("finish", summary="add now adds; the test passes.")),
        ],
    )
    app = make_app(repo, replay, sandbox=sandbox, policy="ask")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "make test_add pass")

        # the edit waits for the person, with its diff
        # the screen is pushed before it is composed: wait for its diff, not only for the screen
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ApprovalScreen) and app.screen.query(DiffView),
            "the first approval",
        )
        diff = app.screen.query_one(DiffView).diff
        assert "-    return a - b" in diff and "+    return a + b" in diff
        assert "a/calculator.py" in diff
        assert "return a - b" in (repo / "calculator.py").read_text()  # nothing written yet
        await pilot.press("y")

        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ApprovalScreen) and app.screen.request.name == "shell",
            "the shell approval",
        )
        assert app.screen.request.name == "shell"
        await pilot.press("a")
        await wait_for(pilot, lambda: _done(app), "the end of the request")

        assert [e.name for e in app.events if isinstance(e, ApprovalNeeded)] == ["editor", "shell"]
        decided = [e for e in app.events if isinstance(e, ApprovalDecided)]
        assert [(e.name, e.approved, e.decided_by) for e in decided] == [
            ("editor", True, "user"),
            ("shell", True, "user"),
            ("shell", True, "remembered"),  # the core's memory of "always"
        ]
        done = next(e for e in app.events if isinstance(e, Done))
        assert done.outcome == "submitted", done.message

        # what the transcript shows
        assert "I will run the failing test first." in [w.shown for w in app.query(AgentText)]
        assert any("reproduce it" in t.text for t in app.query(Thinking))
        cards = app.transcript.cards
        assert [c.tool for c in cards] == ["run_tests", "editor", "shell", "shell", "finish"]
        assert cards[0].query(TestTable), "the test run is drawn as a table"
        assert "+    return a + b" in cards[1].query_one(DiffView).diff
        shell = next(e for e in app.events if isinstance(e, ToolCallFinished) and e.name == "shell")
        assert "42" in shell.full_output

        # /diff shows the session's change; the tree is still untouched
        await send(pilot, "/diff")
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen), "the diff")
        assert "+    return a + b" in app.screen.query_one(DiffView).diff
        await pilot.press("escape")
        assert "return a - b" in (repo / "calculator.py").read_text()

        # /apply: one file, accepted, applied
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyScreen), "the apply dialog")
        assert [c.path for c in app.screen.changes] == ["calculator.py"]
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: "return a + b" in (repo / "calculator.py").read_text(), "the applied file"
        )
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_apply_merges_with_uncommitted_edits_and_brings_later_work(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    subtract_doc = call(
        "editor",
        command="str_replace",
        path="/workspace/calculator.py",
        old_str='    """Return a minus b."""',
        new_str='    """Return a minus b (a - b)."""',
    )
    replay = write_replay(
        tmp_path / "two.jsonl",
        [
            turn("", FIX_ADD),
            turn("", call("finish", summary="fixed add")),
            turn("", subtract_doc),
            turn("", call("finish", summary="documented subtract")),
        ],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(app), "the first request")

        # the person edits the same file meanwhile: /apply merges the change into theirs
        mine = (repo / "calculator.py").read_text() + "\n# my own note\n"
        (repo / "calculator.py").write_text(mine)
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyScreen), "the apply dialog")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: "return a + b" in (repo / "calculator.py").read_text(), "the first apply"
        )
        assert (repo / "calculator.py").read_text().endswith("# my own note\n")  # theirs stays
        await wait_for(
            pilot,
            lambda: any("calculator.py: merged with your edits" in n.text for n in _notices(app)),
            "note",
        )

        # a later request's change applies on top, merged again with the person's note

        await send(pilot, "document subtract")
        await wait_for(pilot, lambda: _done(app, 2), "the second request")
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyScreen), "the second apply dialog")
        change = app.screen.changes[0]
        assert change.applied_before and "+    return a + b" not in change.patch  # only what is new
        await pilot.press("enter")
        await wait_for(pilot, lambda: "(a - b)" in (repo / "calculator.py").read_text(), "the second apply")
        text = (repo / "calculator.py").read_text()
        assert "return a + b" in text and '"""Return a minus b (a - b)."""' in text
        assert text.endswith("# my own note\n")
        await pilot.press("ctrl+q")


def _notices(app: CloverApp) -> list:
    from clover_agent.tui.widgets.notice import NoticeLine

    return list(app.query(NoticeLine))
