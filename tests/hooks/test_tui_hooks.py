"""Hooks in the TUI (Textual's pilot, a replayed session in the local sandbox): a hook that fails
is named in the transcript and changes nothing; a hook's deny shows on the call's card; the
SessionEnd hooks run as the TUI quits."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, HookRan, ModelDelta, ToolCallFinished
from clover_agent.hooks import parse_hooks
from clover_agent.session.assembly import SessionConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.policies import policy_named
from clover_agent.tui.widgets.notice import NoticeLine
from tests.hooks.scripts import CLAUDE_DENYLIST, logged, recorder, script
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import (
    SlowReplay,
    calculator_repo,
    call,
    send,
    session_key,
    turn,
    wait_for,
    write_replay,
)

pytestmark = pytest.mark.slow


async def test_a_failing_hook_is_named_in_the_transcript_and_a_deny_on_the_card(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    broken = script(tmp_path / "hooks", "broken.sh", "echo 'formatter crashed' >&2\nexit 1\n")
    denylist = script(tmp_path / "hooks", "deny-rm.sh", CLAUDE_DENYLIST)
    ends = tmp_path / "end.jsonl"
    end = recorder(tmp_path / "hooks", "end.sh", ends)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="rm -rf /workspace/tests")),
            turn("", call("run_tests")),
            turn("", call("finish", summary="Looked at it.")),
        ],
    )
    tables = {
        "PreToolUse": [{"matcher": "Bash", "command": str(denylist)}],
        "PostToolUse": [{"matcher": "run_tests", "command": str(broken)}],
        "SessionEnd": [{"command": str(end)}],
    }
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        spec=sandbox_spec(repo),
        sandbox_kind="local",
        policy=policy_named("workspace"),
        record_key=session_key(repo),
        hooks=parse_hooks(tables, origin="settings"),
    )
    app = CloverApp(options)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "check the tests")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "done")
        notices = "\n".join(n.text for n in app.query(NoticeLine))
        assert (
            "hook: PostToolUse hook" in notices
            and "failed (it changed nothing): exit 1: formatter crashed" in notices
        )
        assert "denied by hook" in str(app.transcript.cards[0]._status.render())
        tests = next(e for e in app.events if isinstance(e, ToolCallFinished) and e.name == "run_tests")
        assert "formatter crashed" not in tests.output  # a failure changes nothing the model reads
        assert [e.failed for e in app.events if isinstance(e, HookRan)] == [False, True]
        await pilot.press("ctrl+q")
    assert [entry["hook_event_name"] for entry in logged(ends)] == ["SessionEnd"]  # run as the TUI quit


async def test_the_message_after_esc_is_screened_by_user_prompt_submit_hooks(tmp_path: Path) -> None:
    """After Esc the waiting run takes the person's next message up as its request goes on: the
    UserPromptSubmit hooks see it first. A blocked one is said and never reaches the model (the agent
    still waits); the next goes on with the hook's context."""
    repo = calculator_repo(tmp_path)
    screen = script(
        tmp_path / "hooks",
        "screen.py",
        "#!/usr/bin/env python3\nimport json, sys\nprompt = json.load(sys.stdin)['prompt']\n"
        "if 'password' in prompt:\n    print('no secrets in requests', file=sys.stderr)\n    sys.exit(2)\n"
        "print('Ticket CLV-7.')\n",
    )
    long_answer = turn("I will read every file in the repository, one by one. " * 30, call("run_tests"))
    replay = write_replay(tmp_path / "slow.jsonl", [long_answer, turn("", call("finish", summary="ok"))])
    slow = SlowReplay(replay, pauses=[0.25, 0.0])  # the first answer takes minutes to stream
    try:
        options = SessionConfig(
            repo=repo,
            make_backend=slow.backend,
            spec=sandbox_spec(repo),
            sandbox_kind="local",
            policy=policy_named("workspace"),
            record_key=session_key(repo),
            hooks=parse_hooks({"UserPromptSubmit": [{"command": str(screen)}]}, origin="settings"),
        )
        app = CloverApp(options)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "look at the calculator")
            await wait_for(pilot, lambda: any(isinstance(e, ModelDelta) for e in app.events), "the answer")
            await pilot.press("escape")
            agent = app.session.agent
            await wait_for(pilot, lambda: agent is not None and agent.steering.paused, "the interrupt")
            await send(pilot, "the password is hunter2")
            notices = lambda: "\n".join(n.text for n in app.query(NoticeLine))  # noqa: E731
            await wait_for(pilot, lambda: "not sent to the model: no secrets" in notices(), "the block")
            assert agent.steering.paused and not any(isinstance(e, Done) for e in app.events)
            await send(pilot, "Only look, change nothing.")
            await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request's end")
            sent = slow.server.requests[1]["body"]["messages"]
            assert sent[-1] == {
                "role": "user",
                "content": "Only look, change nothing.\n\n[Context from a UserPromptSubmit hook:]\nTicket CLV-7.",
            }
            assert not any("hunter2" in str(m.get("content")) for m in sent)
            await pilot.press("ctrl+q")
    finally:
        slow.close()
