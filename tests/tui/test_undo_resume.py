"""/undo through the agent's checkpoints (``Agent.undo``), and saved sessions resumed (by id and from the
picker), where /undo still reaches the requests made before the resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, WorkspaceUndone
from clover_agent.session.assembly import SessionConfig
from clover_agent.session.store import list_sessions, load_session
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.picker import PickerScreen
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.tool_card import ToolCard
from clover_agent.tui.widgets.user_message import UserMessage
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import (
    FIX_ADD,
    calculator_repo,
    call,
    make_app,
    send,
    session_key,
    turn,
    wait_for,
    write_replay,
)

DOC_SUBTRACT = call(
    "editor",
    command="str_replace",
    path="/workspace/calculator.py",
    old_str='    """Return a minus b."""',
    new_str='    """Return a minus b (a - b)."""',
)


def _done(app: CloverApp, count: int) -> bool:
    return sum(isinstance(e, Done) for e in app.events) >= count


def _notices(app: CloverApp) -> str:
    return " ".join(n.text for n in app.query(NoticeLine))


def _diff(app: CloverApp) -> str:
    assert app.session is not None
    return app.session.run(app.session.diff()).result(timeout=60)


@pytest.mark.slow
async def test_undo_to_an_earlier_request(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "two.jsonl",
        [
            turn("", FIX_ADD),
            turn("", call("finish", summary="1")),
            turn("", DOC_SUBTRACT),
            turn("", call("finish", summary="2")),
        ],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(app, 1), "request 1")
        await send(pilot, "document subtract")
        await wait_for(pilot, lambda: _done(app, 2), "request 2")
        assert "(a - b)" in _diff(app) and "return a + b" in _diff(app)

        await send(pilot, "/undo 2")
        await wait_for(pilot, lambda: "(a - b)" not in _diff(app), "the undo of request 2")
        assert "return a + b" in _diff(app)  # request 1's change stays
        messages = {m.turn: m for m in app.query(UserMessage)}
        await wait_for(pilot, lambda: messages[2].has_class("-undone"), "request 2 marked undone")
        assert not messages[1].has_class("-undone")
        undone = [e for e in app.events if isinstance(e, WorkspaceUndone)]
        assert [(u.step, u.undone) for u in undone] == [(3, "step 3 editor:str_replace")]
        await wait_for(
            pilot,
            lambda: "Workspace back to step 3: undid step 3 editor:str_replace" in _notices(app),
            "the undo shown",
        )
        note = app.session.agent.messages[-1]  # Agent.undo told the model
        assert note["role"] == "user" and "undid the changes made since step 3" in note["content"]

        await send(pilot, "/undo")  # no number: pick from the requests that can still be undone
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), "the undo picker")
        assert [key for key, _ in app.screen.entries] == ["1"]
        await pilot.press("enter")
        await wait_for(pilot, lambda: _diff(app) == "", "the undo of request 1")
        assert "return a - b" in (repo / "calculator.py").read_text()  # the working tree never changed
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_saved_session_resumes_with_its_transcript_workspace_and_conversation(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    first = make_app(
        repo,
        write_replay(
            tmp_path / "a.jsonl", [turn("Fixing.", FIX_ADD), turn("", call("finish", summary="fixed add"))]
        ),
    )
    async with first.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(first, 1), "the first session's request")
        session_id = first.session.session_id
        await pilot.press("ctrl+q")

    saved = list_sessions(repo, session_key(repo))
    assert [(s.session_id, s.title, s.requests) for s in saved] == [(session_id, "fix add", 1)]
    second = make_app(
        repo,
        write_replay(
            tmp_path / "b.jsonl", [turn("", DOC_SUBTRACT), turn("", call("finish", summary="documented"))]
        ),
        resume=load_session(repo, session_id, session_key(repo)),
    )
    async with second.run_test(size=(100, 30)) as pilot:
        # the transcript is redrawn from the saved events
        assert [m.text for m in second.query(UserMessage)] == ["fix add"]
        assert [c.tool for c in second.query(ToolCard)] == ["editor", "finish"]
        await wait_for(pilot, lambda: second.session.agent is not None, "the resumed sandbox")
        assert "return a + b" in _diff(second)  # the saved change is in the fresh sandbox

        await send(pilot, "now document subtract")
        await wait_for(pilot, lambda: _done(second, 2), "the resumed session's request")  # 1 redrawn + 1 new
        conversation = second.session.agent.messages
        users = [m["content"] for m in conversation if m["role"] == "user"]
        assert users == ["fix add", "now document subtract"]
        diff = _diff(second)
        assert "return a + b" in diff and "(a - b)" in diff
        assert second.session.session_id == session_id

        # /undo reaches the request made before the resume (its snapshot was made again)
        await send(pilot, "/undo")
        await wait_for(pilot, lambda: isinstance(second.screen, PickerScreen), "the undo picker")
        assert [key for key, _ in second.screen.entries] == ["2", "1"]
        await pilot.press("escape")
        await send(pilot, "/undo 1")
        await wait_for(pilot, lambda: _diff(second) == "", "the undo of request 1")
        undone = [e for e in second.events if isinstance(e, WorkspaceUndone)]
        assert [(u.step, u.undone) for u in undone] == [
            (1, "step 1 editor:str_replace, step 3 editor:str_replace")
        ]
        messages = {m.turn: m for m in second.query(UserMessage)}
        await wait_for(pilot, lambda: messages[1].has_class("-undone"), "request 1 marked undone")
        assert messages[2].has_class("-undone")
        await pilot.press("ctrl+q")
    assert list_sessions(repo, session_key(repo))[0].requests == 2


@pytest.mark.slow
async def test_resume_without_an_id_opens_a_picker(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    first = make_app(
        repo, write_replay(tmp_path / "a.jsonl", [turn("", call("finish", summary="nothing to do"))])
    )
    async with first.run_test() as pilot:
        await send(pilot, "[/] hello [b")  # a title that is not valid markup
        await wait_for(pilot, lambda: _done(first, 1), "the first session")
        await pilot.press("ctrl+q")
    replay = write_replay(tmp_path / "b.jsonl", [turn("", call("finish", summary="again"))])
    options = SessionConfig(repo=repo, make_backend=lambda: ReplayBackend(replay), spec=sandbox_spec(repo), sandbox_kind="local",
                             record_key=session_key(repo))  # fmt: skip
    app = CloverApp(options, pick_from=list_sessions(repo, session_key(repo)))
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen), "the picker")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.session is not None, "the resumed session")
        assert app.session.session_id == first.session.session_id
        assert [m.text for m in app.query(UserMessage)] == ["[/] hello [b"]
        await pilot.press("ctrl+q")


async def test_a_resumed_session_keeps_its_policy_or_says_what_changed_it(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    first = make_app(repo, write_replay(tmp_path / "a.jsonl", [turn("Nothing to do yet.")]), policy="ask")
    async with first.run_test(size=(100, 30)) as pilot:
        await send(pilot, "hello")
        await wait_for(pilot, lambda: _done(first, 1), "the first request")
        await send(pilot, "/policy read-only")
        await wait_for(pilot, lambda: first.session.policy.name == "read-only", "the policy change")
        session_id = first.session.session_id
        await pilot.press("ctrl+q")
    assert list_sessions(repo, session_key(repo))[0].policy == "read-only"

    replay = write_replay(tmp_path / "b.jsonl", [turn("Still nothing.")])
    kept = make_app(
        repo, replay, resume=load_session(repo, session_id, session_key(repo)), policy_chosen=False
    )
    async with kept.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: kept.session.agent is not None, "the resumed session")
        assert kept.session.policy.name == "read-only" and kept.session.status.policy == "read-only"
        assert kept.status_bar.policy == "read-only" and "Policy:" not in _notices(kept)
        await pilot.press("ctrl+q")

    chosen = make_app(repo, replay, resume=load_session(repo, session_id, session_key(repo)), policy="ask")
    async with chosen.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: "as --policy chose" in _notices(chosen), "the policy note")
        assert chosen.session.policy.name == "ask"
        assert "Policy: ask, as --policy chose; this session had read-only." in _notices(chosen)
        await pilot.press("ctrl+q")
    assert list_sessions(repo, session_key(repo))[0].policy == "ask"


@pytest.mark.slow
async def test_undo_after_apply_says_the_tree_keeps_what_was_applied(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "a.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="fixed add"))]
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(app, 1), "the request")
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyScreen), "the apply dialog", deadline_s=240)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "return a + b" in (repo / "calculator.py").read_text(), "the apply")
        await send(pilot, "/undo 1")
        await wait_for(pilot, lambda: "Your tree keeps what /apply wrote" in _notices(app), "the undo's note")
        assert "to calculator.py: /undo changes the sandbox only" in _notices(app)
        assert "return a + b" in (repo / "calculator.py").read_text()  # the tree is the person's
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_session_resumed_after_an_apply_starts_from_the_tree_as_it_is(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    notes = call("editor", command="create", path="/workspace/NOTES.md", file_text="notes\n")
    first = make_app(
        repo,
        write_replay(
            tmp_path / "a.jsonl", [turn("", FIX_ADD, notes), turn("", call("finish", summary="done"))]
        ),
    )
    async with first.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix add and take notes")
        await wait_for(pilot, lambda: _done(first, 1), "the request")
        await send(pilot, "/apply")
        await wait_for(
            pilot, lambda: isinstance(first.screen, ApplyScreen), "the apply dialog", deadline_s=240
        )
        paths = [c.path for c in first.screen.changes]
        assert sorted(paths) == ["NOTES.md", "calculator.py"]
        for _ in range(paths.index("NOTES.md")):
            await pilot.press("down")
        await pilot.press("space")  # NOTES.md rejected: only calculator.py, judged again on its own
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                isinstance(first.screen, ApplyScreen)
                and [c.path for c in first.screen.changes] == ["calculator.py"]
            ),
            "calculator.py offered on its own",
            deadline_s=240,
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: "return a + b" in (repo / "calculator.py").read_text(), "the apply")
        session_id = first.session.session_id
        await pilot.press("ctrl+q")
    assert not (repo / "NOTES.md").exists()

    second = make_app(
        repo,
        write_replay(tmp_path / "b.jsonl", [turn("", call("finish", summary="nothing more"))]),
        resume=load_session(repo, session_id, session_key(repo)),
    )
    async with second.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: second.session.agent is not None, "the resumed sandbox")
        assert "could not be restored" not in _notices(second), _notices(second)
        left = _diff(second)  # what was applied is in the tree; what was not is still the session's
        assert "NOTES.md" in left and "calculator.py" not in left
        await pilot.press("ctrl+q")

    (repo / "calculator.py").write_text((repo / "calculator.py").read_text().replace("a + b", "b + a"))
    (repo / "NOTES.md").write_text("my own notes\n")  # the tree now disagrees with the session's file
    third = make_app(
        repo,
        write_replay(tmp_path / "c.jsonl", [turn("", call("finish", summary="nothing more"))]),
        resume=load_session(repo, session_id, session_key(repo)),
    )
    async with third.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: "could not be restored" in _notices(third), "the refusal")
        assert "the working tree changed NOTES.md, calculator.py since, differently" in _notices(third)
        await pilot.press("ctrl+q")
