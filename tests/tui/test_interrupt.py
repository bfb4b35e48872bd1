"""Esc stops the agent at once — during a model call (a slow model: a real local server streaming
replayed turns) and during a tool call (a real long command in the sandbox) — and the correction
typed next reaches the agent, which goes on with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.events import Done, ModelDelta, ModelResponded, ToolCallStarted
from clover_agent.tui.app import CloverApp
from clover_agent.tui.driver import INTERRUPTED_BY_USER
from clover_agent.tui.events import MessageQueued, TurnStarted
from clover_agent.tui.widgets.user_message import UserMessage
from tests.tui.helpers import (
    FIX_ADD,
    SlowReplay,
    calculator_repo,
    call,
    make_app,
    send,
    turn,
    wait_for,
    write_replay,
)

SANDBOXES = ["local", pytest.param("docker", marks=pytest.mark.docker)]
CORRECTION = "Stop that: only change add() in calculator.py."


def _count(app: CloverApp, kind: type) -> int:
    return sum(isinstance(e, kind) for e in app.events)


def _done(app: CloverApp) -> list[Done]:
    return [e for e in app.events if isinstance(e, Done)]


@pytest.mark.slow
async def test_interrupt_during_a_model_call_then_a_correction(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    long_answer = turn(
        "I will start by reading every file in the repository, one by one. " * 30, call("run_tests")
    )
    replay = write_replay(
        tmp_path / "slow.jsonl", [long_answer, turn("", FIX_ADD), turn("", call("finish", summary="fixed"))]
    )
    slow = SlowReplay(replay, pauses=[0.25, 0.0])  # the first answer takes minutes to stream
    try:
        app = make_app(repo, slow.backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "fix the calculator")
            await wait_for(pilot, lambda: _count(app, ModelDelta) >= 3, "the slow answer to stream")
            await pilot.press("escape")
            await wait_for(pilot, lambda: _done(app), "the interrupt")
            assert _done(app)[0].outcome == "interrupted"
            assert _count(app, ModelResponded) == 0  # the cut answer never became a turn
            assert not app.session.driver.busy

            await send(pilot, CORRECTION)
            await wait_for(pilot, lambda: len(_done(app)) == 2, "the corrected request")
            assert _done(app)[1].outcome == "submitted", _done(app)[1].message
            sent = slow.server.requests[1]["body"]["messages"]
            assert sent[-1] == {"role": "user", "content": CORRECTION}
            assert "return a + b" in (await_diff(app))
            await pilot.press("ctrl+q")
    finally:
        slow.close()


def await_diff(app: CloverApp) -> str:
    assert app.session is not None
    return app.session.run(app.session.diff()).result(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_interrupt_during_a_tool_call_then_a_correction(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "sleepy.jsonl",
        [
            turn("This will take a while.", call("shell", command="sleep 600", timeout=900)),
            turn("", FIX_ADD),
            turn("", call("finish", summary="fixed add as told")),
        ],
    )
    app = make_app(repo, replay, sandbox=sandbox)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix the calculator")
        await wait_for(pilot, lambda: _count(app, ToolCallStarted) == 1, "the long command to start")
        await pilot.pause(0.5)
        await pilot.press("escape")
        await wait_for(pilot, lambda: _done(app), "the interrupt", deadline_s=120)  # the command runs 600 s
        assert _done(app)[0].outcome == "interrupted"
        card = app.transcript.cards[0]
        assert card.result is None and card.has_class("-error")  # drawn as interrupted

        await send(pilot, CORRECTION)
        await wait_for(pilot, lambda: len(_done(app)) == 2, "the corrected request")
        assert _done(app)[1].outcome == "submitted", _done(app)[1].message
        conversation = app.session.driver.conversation
        cut = next(i for i, m in enumerate(conversation) if m.get("content") == INTERRUPTED_BY_USER)
        assert conversation[cut]["role"] == "tool"
        assert conversation[cut + 1] == {"role": "user", "content": CORRECTION}
        assert "return a + b" in await_diff(app)
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_message_sent_while_the_agent_works_goes_next_and_esc_sends_it_at_once(
    tmp_path: Path,
) -> None:
    repo = calculator_repo(tmp_path)
    long_answer = turn("Let me think about this at length. " * 60, call("run_tests"))
    replay = write_replay(tmp_path / "slow.jsonl", [long_answer, turn("", call("finish", summary="did B"))])
    slow = SlowReplay(replay, pauses=[0.25, 0.0])
    try:
        app = make_app(repo, slow.backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "do A")
            await wait_for(pilot, lambda: _count(app, ModelDelta) >= 2, "the slow answer")
            await send(pilot, "actually, do B")
            await wait_for(pilot, lambda: _count(app, MessageQueued) == 1, "the queued message")
            queued = [m for m in app.query(UserMessage) if m.has_class("-queued")]
            assert [m.text for m in queued] == ["actually, do B"]
            await pilot.press("escape")  # interrupt: the queued message goes at once
            await wait_for(pilot, lambda: len(_done(app)) == 2, "the queued request")
            assert [d.outcome for d in _done(app)] == ["interrupted", "submitted"]
            turns = [e for e in app.events if isinstance(e, TurnStarted)]
            assert [(t.turn, t.text) for t in turns] == [(1, "do A"), (2, "actually, do B")]
            assert slow.server.requests[1]["body"]["messages"][-1] == {
                "role": "user",
                "content": "actually, do B",
            }
            assert not any(m.has_class("-queued") for m in app.query(UserMessage))
            await pilot.press("ctrl+q")
    finally:
        slow.close()
