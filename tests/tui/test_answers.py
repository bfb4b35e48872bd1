"""A prose reply in a conversation is the agent's answer: it ends the turn, with no format error
and no extra model call; ``fix`` (no conversation) still tells the model to call a tool."""

from __future__ import annotations

from pathlib import Path

from clover_agent.agent.loop import Agent
from clover_agent.agent.notes import NO_TOOL_CALL
from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, ErrorReported, EventBus, ModelCallStarted
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tui.widgets.agent_text import AgentText
from clover_agent.tui.widgets.notice import NoticeLine
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay

ANSWER = "`add` returns a - b, so it subtracts: that is why test_add fails."


async def test_a_prose_reply_answers_and_the_next_request_goes_on(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "chat.jsonl",
        [turn(ANSWER), turn("", call("shell", command="true")), turn("Done: nothing else to change.")],
    )
    app = make_app(repo, replay, sandbox="local", policy="workspace")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "why does test_add fail?")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the answer")
        done = [e for e in app.events if isinstance(e, Done)]
        assert [(d.outcome, d.exit_code) for d in done] == [("answered", 0)]
        assert not [e for e in app.events if isinstance(e, ErrorReported)], "no format error, nothing fatal"
        assert sum(isinstance(e, ModelCallStarted) for e in app.events) == 1, "no second call to nudge it"
        shown = " ".join(t.raw for t in app.query(AgentText))
        assert "so it subtracts" in shown
        assert not any("answered" in str(n.render()) for n in app.query(NoticeLine))

        await send(pilot, "check the shell works, then tell me")
        await wait_for(pilot, lambda: sum(isinstance(e, Done) for e in app.events) == 2, "the second turn")
        done = [e for e in app.events if isinstance(e, Done)]
        assert done[-1].outcome == "answered"
        assert sum(isinstance(e, ModelCallStarted) for e in app.events) == 3


async def test_without_a_conversation_a_prose_reply_is_still_a_format_problem(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "fix.jsonl", [turn(ANSWER), turn("", call("finish", summary="ok"))])
    bus = EventBus()
    events: list[object] = []
    bus.subscribe(events.append)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        result = await Agent(ReplayBackend(replay), sandbox, bus, run_id="r1").run("fix test_add", "system")
    assert result.outcome == "submitted"
    assert [e.message for e in events if isinstance(e, ErrorReported)] == [NO_TOOL_CALL]
