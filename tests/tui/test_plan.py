"""Plan mode in the TUI, with replayed sessions in a real local sandbox: ``/plan`` and shift+tab turn
it on (the status bar says so); while planning an edit is refused and the workspace is untouched;
the proposed plan opens its dialog, where it is approved (the plan in the conversation, the policy
back, the edit made, its steps tracked above the prompt), edited first (the edited steps are what is
approved), rejected saying what to change (plan mode goes on; the words reach the model) or left;
a hostile plan is shown as text; a resumed session shows its plan and stays in plan mode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from textual.widgets import Select, Static

from clover_agent.agent.plan import PLAN_NOTE
from clover_agent.events import Done, PlanUpdated, ToolCallFinished
from clover_agent.session.events import TurnStarted
from clover_agent.session.store import load_session
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.plan import PlanEditor, PlanScreen
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.plan_view import PlanNote
from tests.tui.helpers import FIX_ADD, calculator_repo, call, make_app, send, session_key, turn, wait_for
from tests.tui.helpers import write_replay as _write

pytestmark = pytest.mark.slow

STEPS = ["Make add return a + b", "Run the tests"]
VIEW = call("editor", command="view", path="/workspace/calculator.py")


def propose(summary: str = "Fix add: it subtracts.", steps: list[str] = STEPS) -> str:
    return call(
        "propose_plan",
        summary=summary,
        steps=json.dumps(steps),
        files=json.dumps(["calculator.py"]),
        checks=json.dumps(["tests/test_calculator.py"]),
    )


def progress(*statuses: str, steps: list[str] = STEPS) -> str:
    marked = [{"step": s, "status": st} for s, st in zip(steps, statuses, strict=True)]
    return call("update_plan", steps=json.dumps(marked))


def carry_out(steps: list[str] = STEPS) -> list[str]:
    """The turns of an approved plan: step 1 (the fix), step 2 (the tests), finish."""
    return [
        turn("", progress("in_progress", "pending", steps=steps)),
        turn("Fixing add.", FIX_ADD),
        turn("", progress("completed", "in_progress", steps=steps)),
        turn("", call("run_tests", target="tests/test_calculator.py")),
        turn("", progress("completed", "completed", steps=steps)),
        turn("", call("finish", summary="add returns a + b now")),
    ]


PLANNING = [turn("Trying the fix first.", FIX_ADD), turn("Reading.", VIEW), turn("", propose())]


def _ends(app: CloverApp) -> list[str]:
    return [e.outcome for e in app.events if isinstance(e, Done)]


async def _sandbox_file(app: CloverApp) -> str:
    session = app.session
    assert session is not None and session.sandbox is not None
    data = await asyncio.wrap_future(session.run(session.sandbox.read_file("/workspace/calculator.py")))
    return data.decode()


async def _plan_dialog(pilot, app: CloverApp, count: int = 1) -> PlanScreen:
    await wait_for(
        pilot,
        lambda: (
            _ends(app).count("planned") == count
            and isinstance(app.screen, PlanScreen)
            and app.screen.is_mounted
        ),
        f"plan dialog {count}",
    )
    assert isinstance(app.screen, PlanScreen)
    return app.screen


def _said(app: CloverApp, text: str) -> bool:
    return any(text in notice.text for notice in app.transcript.query(NoticeLine))


def _users(app: CloverApp) -> list[str]:
    assert app.session is not None and app.session.agent is not None
    return [m["content"] for m in app.session.agent.messages if m["role"] == "user"]


async def test_plan_then_approve_carries_the_plan_out_with_its_steps_tracked(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    app = make_app(repo, _write(tmp_path / "r.jsonl", [*PLANNING, *carry_out()]))
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "/plan")
        await wait_for(pilot, lambda: app.status_bar.planning, "plan mode")
        assert "plan → workspace" in app.status_bar.line().plain
        await send(pilot, "fix add")
        dialog = await _plan_dialog(pilot, app)

        # read-only before approval: the edit was refused and the sandbox's file is as it was
        refused = next(e for e in app.events if isinstance(e, ToolCallFinished))
        assert refused.name == "editor" and refused.is_error and "'plan'" in refused.output
        assert "return a - b" in await _sandbox_file(app)
        assert _users(app) == [PLAN_NOTE + "fix add"]
        shown = str(dialog.query_one("#plan-text", Static).render())
        assert "1. [ ] Make add return a + b" in shown and "## Checks" in shown
        assert app.hints.state == "plan"
        assert str(app.transcript.query(PlanNote).first().render()).startswith("Plan proposed")

        await pilot.press("a")
        await wait_for(pilot, lambda: _ends(app) == ["planned", "submitted"], "the plan carried out")
        assert not app.session.planning and app.session.agent.policy.name == "workspace"
        status = app.status_bar.line().plain
        assert "plan →" not in status and "workspace" in status
        approved = _users(app)[-1]
        assert approved.startswith("[The user approved this plan") and "Make add return a + b" in approved
        assert PLAN_NOTE not in approved
        assert [e.text for e in app.events if isinstance(e, TurnStarted)][-1].startswith("Approved the plan")
        assert "return a + b" in await _sandbox_file(app)
        assert app.plan_view.display
        assert app.plan_view.text.splitlines()[1:] == ["✓ Make add return a + b", "✓ Run the tests"]
        stages = [e.stage for e in app.events if isinstance(e, PlanUpdated)]
        assert stages == ["proposed", "approved", "progress", "progress", "progress"]

        await send(pilot, f"/export {tmp_path / 'session.md'}")
        await wait_for(pilot, lambda: _said(app, "Transcript written"), "the export")
        exported = (tmp_path / "session.md").read_text()
        assert "**Plan proposed**" in exported and "**Plan approved**" in exported
        assert "1. [ ] Make add return a + b" in exported and "*Plan: 2/2 steps done*" in exported


async def test_the_key_plans_and_an_edited_plan_is_what_is_approved(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    edited = ["Fix add in calculator.py", "Run test_add"]
    app = make_app(repo, _write(tmp_path / "r.jsonl", [turn("", propose()), *carry_out(edited)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot, lambda: app.session is not None and app.session.agent is not None, "the sandbox"
        )
        await pilot.press("shift+tab")
        await wait_for(pilot, lambda: app.session.planning and app.status_bar.planning, "plan mode by key")
        await pilot.press("shift+tab")
        await wait_for(pilot, lambda: not app.session.planning, "plan mode off by key")
        assert app.session.agent.policy.name == "workspace"
        await pilot.press("shift+tab")
        await wait_for(pilot, lambda: app.session.planning, "plan mode on again")
        await send(pilot, "fix add")
        dialog = await _plan_dialog(pilot, app)

        await pilot.press("e")
        editor = dialog.query_one(PlanEditor)
        assert editor.has_focus and "1. [ ] Make add return a + b" in editor.text
        await pilot.press("a", "e", "r", "l")  # typed into the plan, not the dialog's choices
        assert app.screen is dialog and editor.text.startswith("aerl")
        editor.load_text("Nothing to do.")
        await pilot.press("ctrl+s")
        assert "no steps" in str(dialog.query_one("#plan-error", Static).render())
        assert editor.display  # still editing
        editor.load_text("Fix add.\n\n## Steps\n1. [ ] Fix add in calculator.py\n- Run test_add\n")
        await pilot.press("ctrl+s")
        assert not editor.display and "2. [ ] Run test_add" in str(
            dialog.query_one("#plan-text", Static).render()
        )
        dialog.query_one(Select).value = "ask"  # go on under another policy than before planning
        await pilot.press("a")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ApprovalScreen), "the edit asked about under ask"
        )
        assert app.session.agent.policy.name == "ask" and "│ ask" in app.status_bar.line().plain
        await pilot.press("y")

        await wait_for(pilot, lambda: _ends(app) == ["planned", "submitted"], "the edited plan carried out")
        approved = next(e for e in app.events if isinstance(e, PlanUpdated) and e.stage == "approved")
        assert [s["step"] for s in approved.plan["steps"]] == edited
        assert "Run test_add" in _users(app)[-1] and "Run the tests" not in _users(app)[-1]
        assert app.plan_view.text.splitlines()[1:] == ["✓ Fix add in calculator.py", "✓ Run test_add"]


async def test_reject_with_a_message_plans_again_and_leaving_ends_plan_mode(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = [
        turn("", propose()),
        turn("", propose("Fix add and test subtract too.", [*STEPS, "Test subtract"])),
    ]
    app = make_app(repo, _write(tmp_path / "r.jsonl", replay), policy="ask")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "/plan on")
        await wait_for(pilot, lambda: app.status_bar.planning, "plan mode")
        assert "plan → ask" in app.status_bar.line().plain
        await wait_for(pilot, lambda: app.session.agent is not None, "the sandbox")
        await send(pilot, "/policy workspace")  # the policy plan mode goes back to
        await wait_for(pilot, lambda: _said(app, "After plan mode, the policy is workspace"), "the policy")
        assert app.session.agent.policy.name == "plan" and "plan → workspace" in app.status_bar.line().plain
        await send(pilot, "fix add")
        await _plan_dialog(pilot, app)
        await pilot.press("r")
        for char in "also test subtract":
            await pilot.press("space" if char == " " else char)
        await pilot.press("enter")

        dialog = await _plan_dialog(pilot, app, 2)
        assert _users(app)[-1] == PLAN_NOTE + "also test subtract"  # still in plan mode
        assert "3. [ ] Test subtract" in str(dialog.query_one("#plan-text", Static).render())
        await pilot.press("l")
        await wait_for(pilot, lambda: not app.session.planning, "plan mode left")
        assert app.session.agent.policy.name == "workspace" and not app.status_bar.planning
        assert not any(e.stage == "approved" for e in app.events if isinstance(e, PlanUpdated))


async def test_a_hostile_plan_is_shown_as_text(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    evil = "[bold red]markup[/] \x1b[2J\x1b]52;c;aGk=\x07"
    replay = [turn("", propose(f"Summary {evil}", [f"step {evil}", "[link=https://x]y[/link]"]))]
    app = make_app(repo, _write(tmp_path / "r.jsonl", replay))
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "/plan")
        await send(pilot, "fix add")
        dialog = await _plan_dialog(pilot, app)
        shown = str(dialog.query_one("#plan-text", Static).render())
        assert "Summary [bold red]markup[/] \\x1b[2J\\x1b]52;c;aGk=\\x07" in shown
        assert "2. [ ] [link=https://x]y[/link]" in shown and "\x1b" not in shown
        await pilot.press("e")
        assert "\x1b" not in dialog.query_one(PlanEditor).text  # what is edited is what was seen
        await pilot.press("escape")  # the edit dropped
        assert app.screen is dialog and not dialog.query_one(PlanEditor).display
        await pilot.press("escape")  # the plan waits
        await wait_for(pilot, lambda: not isinstance(app.screen, PlanScreen), "the dialog closed")
        note = str(app.transcript.query(PlanNote).first().render())
        assert "[bold red]markup[/]" in note and "\x1b" not in note and "[link=https://x]y[/link]" in note
        await send(pilot, "/plan show")  # the proposal comes back to be judged
        await _plan_dialog(pilot, app)
        await pilot.press("escape")


async def test_a_resumed_session_shows_its_plan_and_stays_in_plan_mode(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    first = make_app(repo, _write(tmp_path / "a.jsonl", [turn("", propose()), *carry_out()]))
    async with first.run_test(size=(100, 30)) as pilot:
        await send(pilot, "/plan")
        await send(pilot, "fix add")
        await _plan_dialog(pilot, first)
        await pilot.press("a")
        await wait_for(pilot, lambda: _ends(first) == ["planned", "submitted"], "the plan carried out")
        await send(pilot, "/plan")  # planning again when saved
        await wait_for(pilot, lambda: first.session.planning, "plan mode")
        session_id = first.session.session_id  # leaving the app closes the session, saved

    replay = _write(tmp_path / "b.jsonl", [turn("", FIX_ADD), turn("Nothing more to plan.")])
    second = make_app(repo, replay, resume=load_session(repo, session_id, session_key(repo)))
    async with second.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: second.session.agent is not None, "the resumed sandbox")
        assert second.plan_view.text.splitlines()[1:] == ["✓ Make add return a + b", "✓ Run the tests"]
        assert second.session.planning and second.session.agent.planning
        assert "plan → workspace" in second.status_bar.line().plain
        assert second.session.agent.plan is not None and second.session.agent.plan.done == 2
        await send(pilot, "anything else?")
        await wait_for(pilot, lambda: len(_ends(second)) == 3, "the resumed request")  # 2 redrawn
        refused = [e for e in second.events if isinstance(e, ToolCallFinished)][-1]
        assert refused.is_error and "'plan'" in refused.output
        await send(pilot, "/plan show")
        await wait_for(pilot, lambda: isinstance(second.screen, PlanScreen), "the plan, to read")
        assert not second.screen.choices and second.hints.state == "view"
        await pilot.press("escape")
