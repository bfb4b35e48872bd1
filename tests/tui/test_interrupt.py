"""Esc stops the agent at once (``Agent.interrupt``) — during a model call (a slow model: a real local
server streaming replayed turns) and during a tool call (a real long command in the sandbox, whose
processes are gone afterwards) — and the agent waits: the correction typed next reaches it
(``Agent.send``) and the same request goes on with it. A message typed while the agent works is
read at its next step, and one it had no step left to read becomes the next request."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from clover_agent.agent.notes import INTERRUPTED_REPLY, INTERRUPTED_TOOL
from clover_agent.events import (
    CallInterrupted,
    Done,
    ModelDelta,
    ModelResponded,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.session.events import MessageQueued, TurnStarted
from clover_agent.tui.app import CloverApp
from clover_agent.tui.widgets.activity import ActivityLine
from clover_agent.tui.widgets.notice import NoticeLine
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
            await wait_for(pilot, lambda: _count(app, CallInterrupted) == 1, "the interrupt")
            (interrupted,) = [e for e in app.events if isinstance(e, CallInterrupted)]
            assert interrupted.during == "model"
            assert _count(app, ModelResponded) == 0  # the cut answer never became a turn
            agent = app.session.agent
            # the request did not end: the agent waits for the person's message
            assert not _done(app) and agent.running and agent.steering.paused
            await wait_for(pilot, lambda: "waits for your message" in _notices(app), "the notice")

            await send(pilot, CORRECTION)
            await wait_for(pilot, lambda: _done(app), "the corrected request")
            assert _done(app)[0].outcome == "submitted", _done(app)[0].message
            sent = slow.server.requests[1]["body"]["messages"]
            assert sent[-2:] == [
                {"role": "user", "content": INTERRUPTED_REPLY},
                {"role": "user", "content": CORRECTION},
            ]
            assert [(t.turn, t.text) for t in app.events if isinstance(t, TurnStarted)] == [
                (1, "fix the calculator")
            ]  # the correction belongs to the same request
            assert "return a + b" in (await_diff(app))
            await pilot.press("ctrl+q")
    finally:
        slow.close()


def await_diff(app: CloverApp) -> str:
    assert app.session is not None
    return app.session.run(app.session.diff()).result(timeout=60)


def _processes(app: CloverApp) -> str:
    """The command lines of the processes the sandbox sees (ps runs in it)."""
    session = app.session
    assert session is not None and session.sandbox is not None
    return session.run(session.sandbox.exec("ps -eo args")).result(timeout=60).output


def _notices(app: CloverApp) -> str:
    return "\n".join(n.text for n in app.query(NoticeLine))


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_interrupt_during_a_tool_call_then_a_correction(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    # a sleep of its own: the local sandbox sees the host's processes, the other variant's among them
    sleep = f"sleep 613.{uuid.uuid4().int % 10**6:06d}"
    replay = write_replay(
        tmp_path / "sleepy.jsonl",
        [
            turn("This will take a while.", call("shell", command=sleep, timeout=900)),
            turn("", FIX_ADD),
            turn("", call("finish", summary="fixed add as told")),
        ],
    )
    app = make_app(repo, replay, sandbox=sandbox)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "fix the calculator")
        await wait_for(pilot, lambda: _count(app, ToolCallStarted) == 1, "the long command to start")
        await wait_for(pilot, lambda: sleep in _processes(app), "the command's process")
        await pilot.press("escape")
        await wait_for(pilot, lambda: _count(app, ToolCallFinished) == 1, "the interrupt")  # not 600 s
        (interrupted,) = [e for e in app.events if isinstance(e, CallInterrupted)]
        assert (interrupted.during, interrupted.name) == ("tool", "shell")
        assert sleep not in _processes(app)  # the command's processes were killed in the sandbox
        card = app.transcript.cards[0]
        await wait_for(pilot, lambda: card.result is not None, "the card's result")
        assert card.was_interrupted and card.has_class("-error")  # drawn as interrupted
        assert not _done(app) and app.session.agent.steering.paused  # the session goes on
        await wait_for(pilot, lambda: "waiting for you" in app.status_bar.line().plain, "the status")
        await pilot.pause(0.6)  # the interrupted call's end and its checkpoint came after the interrupt
        assert not app.query_one(ActivityLine).has_class("-active")  # no spinner counting on

        await send(pilot, CORRECTION)
        await wait_for(pilot, lambda: _done(app), "the corrected request")
        assert _done(app)[0].outcome == "submitted", _done(app)[0].message
        conversation = app.session.agent.messages
        cut = next(i for i, m in enumerate(conversation) if m.get("content") == INTERRUPTED_TOOL)
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
            await pilot.press("escape")  # interrupt: the agent reads the queued message at once
            await wait_for(pilot, lambda: _done(app), "the request with the message")
            assert [d.outcome for d in _done(app)] == ["submitted"]
            turns = [e for e in app.events if isinstance(e, TurnStarted)]
            assert [(t.turn, t.text) for t in turns] == [(1, "do A")]
            assert slow.server.requests[1]["body"]["messages"][-2:] == [
                {"role": "user", "content": INTERRUPTED_REPLY},
                {"role": "user", "content": "actually, do B"},
            ]
            assert not any(m.has_class("-queued") for m in app.query(UserMessage))
            await pilot.press("ctrl+q")
    finally:
        slow.close()


@pytest.mark.slow
async def test_a_message_sent_during_a_tool_call_is_read_after_it(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "go"
    wait = f"while [ ! -e {gate} ]; do sleep 0.1; done; echo waited"  # the test decides when it ends
    replay = write_replay(
        tmp_path / "r.jsonl",
        [turn("", call("shell", command=wait, timeout=600)), turn("", call("finish", summary="did both"))],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "do A")
        await wait_for(pilot, lambda: _count(app, ToolCallStarted) == 1, "the command to start")
        await send(pilot, "and then B")
        await wait_for(pilot, lambda: _count(app, MessageQueued) == 1, "the queued message")
        gate.touch()
        await wait_for(pilot, lambda: _done(app), "the request")
        assert [d.outcome for d in _done(app)] == ["submitted"]
        talk = [(m["role"], m.get("content", "")) for m in app.session.agent.messages]
        result = next(i for i, (role, _) in enumerate(talk) if role == "tool")
        assert "waited" in talk[result][1]
        assert talk[result + 1] == ("user", "and then B")  # after the call's result, before the next turn
        assert talk[result + 2][0] == "assistant"
        assert not any(m.has_class("-queued") for m in app.query(UserMessage))
        assert [e.text for e in app.events if isinstance(e, TurnStarted)] == ["do A"]
        await pilot.press("ctrl+q")


@pytest.mark.slow
async def test_a_message_the_agent_did_not_read_before_finishing_is_the_next_request(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    slow_finish = turn("Wrapping up. " * 60, call("finish", summary="did A"))
    replay = write_replay(tmp_path / "r.jsonl", [slow_finish, turn("", call("finish", summary="did B"))])
    slow = SlowReplay(replay, pauses=[0.25, 0.0])
    try:
        app = make_app(repo, slow.backend)
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "do A")
            await wait_for(pilot, lambda: _count(app, ModelDelta) >= 2, "the slow answer")
            await send(pilot, "then B")  # the answer ends with finish: no step reads it in this request
            await wait_for(pilot, lambda: len(_done(app)) == 2, "the request it became")
            assert [d.summary for d in _done(app)] == ["did A", "did B"]
            turns = [(e.turn, e.text) for e in app.events if isinstance(e, TurnStarted)]
            assert turns == [(1, "do A"), (2, "then B")]
            sent = slow.server.requests[1]["body"]["messages"]
            assert sent[-1] == {"role": "user", "content": "then B"}
            assert sum(m.get("content") == "then B" for m in sent) == 1  # once, not also as a steer
            assert [m.text for m in app.query(UserMessage)] == ["do A", "then B"]  # drawn once
            assert not any(m.has_class("-queued") for m in app.query(UserMessage))
            await pilot.press("ctrl+q")
    finally:
        slow.close()
