"""Hooks in the TUI (Textual's pilot, a replayed session in the local sandbox): a hook that fails
is named in the transcript and changes nothing; a hook's deny shows on the call's card; the
SessionEnd hooks run as the TUI quits."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, HookRan, ToolCallFinished
from clover_agent.hooks import parse_hooks
from clover_agent.session.assembly import SessionConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.policies import policy_named
from clover_agent.tui.widgets.notice import NoticeLine
from tests.hooks.scripts import CLAUDE_DENYLIST, logged, recorder, script
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, call, send, session_key, turn, wait_for, write_replay

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
