"""The approval dialog's answers beyond yes and no: deny saying what to do instead (the model reads
the person's words in the call's result and the session goes on), and "always", whose scope the
dialog states and the session keeps (the same command again is not asked; another one, or another
kind of edit, still is)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input, Static

from clover_agent.events import ApprovalDecided, Done, ToolCallFinished, ToolCallStarted
from clover_agent.session.events import ApprovalNeeded
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.approval import ApprovalScreen
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay

FEEDBACK = "no run the tests instead and say what fails"  # holds y, a and n: they must type, not answer


def _ends(app: CloverApp) -> int:
    return sum(isinstance(e, Done) for e in app.events)


def _dialog_text(app: CloverApp) -> str:
    return "\n".join(str(s.render()) for s in app.screen.query(Static))


async def _asked(pilot, app: CloverApp, count: int) -> ApprovalScreen:
    """The ``count``-th approval dialog, once it is composed."""
    await wait_for(
        pilot,
        lambda: (
            sum(isinstance(e, ApprovalNeeded) for e in app.events) == count
            and isinstance(app.screen, ApprovalScreen)
            and app.screen.is_mounted
            and app.screen.request.call_id
            == [e for e in app.events if isinstance(e, ApprovalNeeded)][-1].call_id
        ),
        f"approval {count}",
    )
    assert isinstance(app.screen, ApprovalScreen)
    return app.screen


@pytest.mark.slow
async def test_deny_saying_what_to_do_instead(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="rm -rf /workspace/tests")),
            turn("As you say.", call("run_tests", target="tests/test_calculator.py::test_add")),
            turn("", call("finish", summary="ran the tests as asked")),
            turn("", call("finish", summary="the second request ran too")),
        ],
    )
    app = make_app(repo, replay, policy="ask")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "clean up")
        dialog = await _asked(pilot, app, 1)
        assert "Deny, say why (f)" in [str(b.label) for b in dialog.query("Button")]
        await pilot.press("f")
        line = dialog.query_one(Input)
        assert line.has_focus
        await pilot.press("escape")  # back to the buttons: the call still waits
        assert app.screen is dialog and not line.display
        await pilot.press("f")
        for word_index, word in enumerate(FEEDBACK.split()):
            if word_index:
                await pilot.press("space")
            await pilot.press(*word)
        assert app.screen is dialog and line.value == FEEDBACK  # y / a / n went into the line
        await pilot.press("enter")
        await wait_for(pilot, lambda: _ends(app) == 1, "the end of the request")

        decided = next(e for e in app.events if isinstance(e, ApprovalDecided))
        assert (decided.approved, decided.decided_by, decided.answer) == (False, "user", "deny")
        assert decided.feedback == FEEDBACK
        refused = next(e for e in app.events if isinstance(e, ToolCallFinished))
        assert refused.is_error and FEEDBACK in refused.output
        assert app.session is not None and app.session.agent is not None
        tool_messages = [m for m in app.session.agent.messages if m.get("role") == "tool"]
        assert FEEDBACK in str(tool_messages[0]["content"])  # what the model reads next
        assert "rm -rf" in str(tool_messages[0]["content"])
        assert "tests/test_calculator.py::test_add" in str(tool_messages[1]["content"])  # it went on
        assert (repo / "tests").is_dir()
        assert FEEDBACK in str(app.transcript.cards[0]._status.render())

        await send(pilot, "and now?")  # the session is not wedged
        await wait_for(pilot, lambda: _ends(app) == 2, "the second request")
        assert next(e for e in app.events if isinstance(e, Done) and "second" in e.summary)
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_always_says_its_scope_and_keeps_to_it(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="echo one")),
            turn("", call("shell", command="echo one")),  # the same command: not asked
            turn("", call("shell", command="echo two")),  # another command: asked
            turn("", call("editor", command="create", path="/workspace/a.txt", file_text="a\n")),
            turn("", call("editor", command="create", path="/workspace/b.txt", file_text="b\n")),
            turn("", call("editor", command="insert", path="/workspace/a.txt", insert_line=1, new_str="c")),
            turn("", call("finish", summary="scoped")),
        ],
    )
    app = make_app(repo, replay, policy="ask")
    async with app.run_test(size=(110, 36)) as pilot:
        await send(pilot, "go")
        dialog = await _asked(pilot, app, 1)
        said = _dialog_text(app)
        assert (
            "Always (a) allows `shell` running exactly `echo one` again, without asking, "
            "for the rest of this session under the 'ask' policy." in said
        ), said
        await pilot.press("a")
        dialog = await _asked(pilot, app, 2)
        assert dialog.request.arguments == {"command": "echo two"}
        assert "exactly `echo two`" in _dialog_text(app)
        await pilot.press("y")
        dialog = await _asked(pilot, app, 3)
        assert dialog.request.arguments["path"] == "/workspace/a.txt"
        said = _dialog_text(app)
        assert "Always (a) allows every `editor:create` call (any file, not only this one)" in said, said
        await pilot.press("a")
        dialog = await _asked(pilot, app, 4)  # b.txt was created without asking; insert is asked
        assert dialog.request.arguments["command"] == "insert"
        assert "every `editor:insert` call" in _dialog_text(app)
        await pilot.press("n")
        await wait_for(pilot, lambda: _ends(app) == 1, "the end of the request")

        started = {e.call_id: e.arguments for e in app.events if isinstance(e, ToolCallStarted)}
        decided = [
            (started[e.call_id].get("path") or started[e.call_id]["command"], e.decided_by, e.approved)
            for e in app.events
            if isinstance(e, ApprovalDecided)
        ]
        assert decided == [
            ("echo one", "user", True),
            ("echo one", "remembered", True),
            ("echo two", "user", True),
            ("/workspace/a.txt", "user", True),
            ("/workspace/b.txt", "remembered", True),
            ("/workspace/a.txt", "user", False),
        ]
        assert app.session is not None
        made = app.session.run(app.session.diff()).result(timeout=60)
        assert "b/a.txt" in made and "b/b.txt" in made
        await pilot.press("ctrl+q")
