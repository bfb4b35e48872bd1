"""Hooks in the TUI (Textual's pilot, a replayed session in the local sandbox): a hook that fails
is named in the transcript and changes nothing; a hook's deny shows on the call's card; the
SessionEnd hooks run as the TUI quits; every message of the person's is screened by the
UserPromptSubmit hooks, the one typed while the agent works too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import Input

from clover_agent.backends.base import ModelBackend
from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import ApprovalDecided, Done, HookRan, ModelDelta, ToolCallFinished, ToolCallStarted
from clover_agent.hooks import parse_hooks
from clover_agent.session.assembly import SessionConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.policies import policy_named
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.user_message import UserMessage
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

#: A UserPromptSubmit hook that blocks any request naming a password and adds a ticket to the others.
SCREEN = (
    "#!/usr/bin/env python3\nimport json, sys\nprompt = json.load(sys.stdin)['prompt']\n"
    "if 'password' in prompt:\n    print('no secrets in requests', file=sys.stderr)\n    sys.exit(2)\n"
    "print('Ticket CLV-7.')\n"
)


def screened_app(
    repo: Path, make_backend: Callable[[], ModelBackend], screen: Path, policy: str = "workspace"
) -> CloverApp:
    """The TUI on ``repo`` in the local sandbox with ``screen`` as its one UserPromptSubmit hook."""
    return CloverApp(
        SessionConfig(
            repo=repo,
            make_backend=make_backend,
            spec=sandbox_spec(repo),
            sandbox_kind="local",
            policy=policy_named(policy),
            record_key=session_key(repo),
            hooks=parse_hooks({"UserPromptSubmit": [{"command": str(screen)}]}, origin="settings"),
        )
    )


def notices(app: CloverApp) -> str:
    """The transcript's notice lines, one text."""
    return "\n".join(n.text for n in app.query(NoticeLine))


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
        shown = notices(app)
        assert (
            "hook: PostToolUse hook" in shown
            and "failed (it changed nothing): exit 1: formatter crashed" in shown
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
    screen = script(tmp_path / "hooks", "screen.py", SCREEN)
    long_answer = turn("I will read every file in the repository, one by one. " * 30, call("run_tests"))
    replay = write_replay(tmp_path / "slow.jsonl", [long_answer, turn("", call("finish", summary="ok"))])
    slow = SlowReplay(replay, pauses=[0.25, 0.0])  # the first answer takes minutes to stream
    try:
        app = screened_app(repo, slow.backend, screen)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "look at the calculator")
            await wait_for(pilot, lambda: any(isinstance(e, ModelDelta) for e in app.events), "the answer")
            await pilot.press("escape")
            agent = app.session.agent
            await wait_for(pilot, lambda: agent is not None and agent.steering.paused, "the interrupt")
            await send(pilot, "the password is hunter2")
            await wait_for(pilot, lambda: "not sent to the model: no secrets" in notices(app), "the block")
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


async def test_a_message_typed_while_the_agent_works_is_screened_before_it_is_queued(tmp_path: Path) -> None:
    """A message sent while the agent runs a call is queued for its next step: the UserPromptSubmit
    hooks see it first. A blocked one never reaches the model; the transcript marks it not sent and
    says why, and it is back in the (empty) prompt; an allowed one is read with the hook's context."""
    repo = calculator_repo(tmp_path)
    screen = script(tmp_path / "hooks", "screen.py", SCREEN)
    gate = tmp_path / "go"
    wait = f"while [ ! -e {gate} ]; do sleep 0.1; done; echo waited"  # the test decides when it ends
    replay = write_replay(
        tmp_path / "r.jsonl",
        [turn("", call("shell", command=wait, timeout=600)), turn("", call("finish", summary="did B"))],
    )
    model = SlowReplay(replay, pauses=[0.0])
    try:
        app = screened_app(repo, model.backend, screen)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "do A")
            await wait_for(pilot, lambda: any(isinstance(e, ToolCallStarted) for e in app.events), "the call")
            secret = "also, the password is hunter2"
            await send(pilot, secret)
            await wait_for(pilot, lambda: "not sent to the model: no secrets" in notices(app), "the block")
            blocked = [m for m in app.query(UserMessage) if m.has_class("-blocked")]
            assert [m.text for m in blocked] == [secret]
            assert not any(m.has_class("-queued") for m in app.query(UserMessage))
            assert app.prompt.text == secret  # back in the prompt, to edit
            app.prompt.clear()
            await send(pilot, "and then B")
            queued = lambda: [m.text for m in app.query(UserMessage) if m.has_class("-queued")]  # noqa: E731
            await wait_for(pilot, lambda: queued() == ["and then B"], "the queued message")
            gate.touch()
            await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request's end")
            assert [e.outcome for e in app.events if isinstance(e, Done)] == ["submitted"]
            asked = [r["body"]["messages"] for r in model.server.requests]
            assert len(asked) == 2
            assert asked[1][-2]["role"] == "tool" and "waited" in asked[1][-2]["content"]
            assert asked[1][-1] == {
                "role": "user",
                "content": "and then B\n\n[Context from a UserPromptSubmit hook:]\nTicket CLV-7.",
            }
            assert not any("hunter2" in str(m.get("content")) for request in asked for m in request)
            assert not any("hunter2" in str(m.get("content")) for m in app.session.agent.messages)
            await pilot.press("ctrl+q")
    finally:
        model.close()


async def test_the_words_of_a_denial_are_screened_before_the_model_reads_them(tmp_path: Path) -> None:
    """Deny, saying what to do instead: the model reads those words with the refusal, so the
    UserPromptSubmit hooks see them first. Blocked, the call is denied without them, the person is
    told why and gets the words back in the prompt."""
    repo = calculator_repo(tmp_path)
    screen = script(tmp_path / "hooks", "screen.py", SCREEN)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("shell", command="rm -rf /workspace/tests")),
            turn("", call("finish", summary="left the tests alone")),
        ],
    )
    model = SlowReplay(replay, pauses=[0.0])
    try:
        app = screened_app(repo, model.backend, screen, policy="ask")
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "clean up")
            await wait_for(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval dialog")
            dialog = app.screen
            await pilot.press("f")
            words = "no, the password is hunter2, use that"
            dialog.query_one(Input).value = words
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request's end")
            assert "not sent to the model: no secrets in requests" in notices(app)
            assert app.prompt.text == words  # back in the prompt
            decided = next(e for e in app.events if isinstance(e, ApprovalDecided))
            assert not decided.approved and decided.feedback == ""
            asked = [r["body"]["messages"] for r in model.server.requests]
            assert len(asked) == 2 and asked[1][-1]["role"] == "tool"  # the refusal, without the words
            assert not any("hunter2" in str(m.get("content")) for request in asked for m in request)
            assert (repo / "tests").is_dir()
            await pilot.press("ctrl+q")
    finally:
        model.close()


async def test_a_screened_message_the_run_did_not_read_is_the_next_request_screened_once(
    tmp_path: Path,
) -> None:
    """A message typed while the agent works is screened as it is sent; when the run ends before
    reading it, it is the next request as it was screened: the hooks do not run on it again, so
    their context is there once."""
    repo = calculator_repo(tmp_path)
    log = tmp_path / "prompts.jsonl"
    screen = recorder(tmp_path / "hooks", "screen.sh", log, "echo 'Ticket CLV-7.'\n")
    slow_finish = turn("Wrapping up. " * 60, call("finish", summary="did A"))
    replay = write_replay(tmp_path / "r.jsonl", [slow_finish, turn("", call("finish", summary="did B"))])
    model = SlowReplay(replay, pauses=[0.25, 0.0])
    try:
        app = screened_app(repo, model.backend, screen)
        async with app.run_test(size=(120, 40)) as pilot:
            await send(pilot, "do A")
            await wait_for(pilot, lambda: any(isinstance(e, ModelDelta) for e in app.events), "the answer")
            await send(pilot, "then B")  # the answer ends with finish: no step reads it in this request
            ends = lambda: [e for e in app.events if isinstance(e, Done)]  # noqa: E731
            await wait_for(pilot, lambda: len(ends()) == 2, "the request it became")
            assert [d.summary for d in ends()] == ["did A", "did B"]
            assert [e["prompt"] for e in logged(log)] == ["do A", "then B"]  # each screened once
            asked = model.server.requests[1]["body"]["messages"]
            context = "\n\n[Context from a UserPromptSubmit hook:]\nTicket CLV-7."
            assert asked[-1] == {"role": "user", "content": "then B" + context}
            assert [m.text for m in app.query(UserMessage)] == ["do A", "then B"]  # as typed, once
            await pilot.press("ctrl+q")
    finally:
        model.close()
