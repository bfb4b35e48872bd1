"""The hooks runner with real scripts: every way a hook can answer, and every way it can fail.

Each test writes small executables, binds them in a :class:`Hooks` as the settings would, and
checks what the runner decided and the ``HookRan`` events it reported.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from clover_agent.events import EventBus, HookRan
from clover_agent.hooks import Hooks, PromptVerdict, hook_line, parse_hooks
from clover_agent.hooks.outcome import REASON_CHARS
from clover_agent.hooks.process import READ_LIMIT
from clover_agent.hooks.runner import MAX_SENDS_BACK
from tests.hooks.scripts import CLAUDE_DENYLIST, logged, recorder, script


def hooks_of(tmp_path: Path, tables: dict, bus: EventBus | None = None) -> tuple[Hooks, list[HookRan]]:
    """A runner for ``tables`` (the ``[hooks]`` table as TOML gives it), and the events it reports."""
    bus = bus or EventBus()
    seen: list[HookRan] = []
    bus.subscribe(lambda e: seen.append(e) if isinstance(e, HookRan) else None)
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    runner = Hooks(
        parse_hooks(tables, origin="settings"),
        bus,
        session_id="s1",
        repo=repo,
        transcript=tmp_path / "trajectory.jsonl",
        environ=os.environ,
    )
    return runner, seen


def one(event: str, command: Path | str, **table: object) -> dict:
    return {event: [{"command": str(command), **table}]}


async def test_pre_tool_use_exit_2_denies_with_stderr_as_the_reason(tmp_path: Path) -> None:
    deny = script(tmp_path, "deny.sh", "echo 'no shells today' >&2\nexit 2\n")
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", deny, matcher="Bash"))
    verdict = await hooks.pre_tool_use("c1", "shell", {"command": "ls"})
    assert verdict.deny == "no shells today"
    assert [(e.decided, e.exit_code, e.tool, e.call_id) for e in seen] == [("deny", 2, "shell", "c1")]
    # the matcher is on the tool's names: the editor is not Bash
    assert (
        await hooks.pre_tool_use("c2", "editor", {"command": "view", "path": "/workspace/a"})
    ).deny is None


async def test_pre_tool_use_json_permission_decision_deny(tmp_path: Path) -> None:
    body = """cat > /dev/null
echo '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
       "permissionDecisionReason": "edits to secrets are off limits"}}'
"""
    deny = script(tmp_path, "deny.sh", body)
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", deny, matcher="Edit|Write"))
    verdict = await hooks.pre_tool_use(
        "c1", "editor", {"command": "create", "path": "/workspace/.env", "file_text": "x"}
    )
    assert verdict.deny == "edits to secrets are off limits"
    assert seen[0].decided == "deny" and not seen[0].failed


async def test_claude_code_style_tool_input_and_updated_input(tmp_path: Path) -> None:
    """The script reads Claude Code's names (file_path, old_string) and answers with updatedInput in
    them; the arguments come back in ours, the file path made the workspace's again."""
    log = tmp_path / "seen.jsonl"
    body = f"""import json, sys
data = json.load(sys.stdin)
open({str(log)!r}, "a").write(json.dumps(data) + "\\n")
new = dict(data["tool_input"], new_string=data["tool_input"]["new_string"].upper())
print(json.dumps({{"hookSpecificOutput": {{"hookEventName": "PreToolUse", "updatedInput": new}}}}))
"""
    modify = script(tmp_path, "modify.py", "#!/usr/bin/env python3\n" + body)
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", modify, matcher="Edit"))
    arguments = {"command": "str_replace", "path": "/workspace/src/a.py", "old_str": "x", "new_str": "y"}
    verdict = await hooks.pre_tool_use("c1", "editor", arguments)
    given = logged(log)[0]
    assert given["hook_event_name"] == "PreToolUse" and given["session_id"] == "s1"
    assert given["cwd"] == str(tmp_path / "repo")
    assert given["tool_input"]["file_path"] == str(tmp_path / "repo" / "src" / "a.py")
    assert given["tool_input"]["old_string"] == "x" and given["tool_input"]["old_str"] == "x"
    assert given["tool_aliases"] == ["Edit"]
    assert verdict.deny is None
    assert verdict.arguments == {**arguments, "new_str": "Y"}
    assert seen[0].decided == "modify"


async def test_the_well_known_claude_code_denylist_works_unchanged(tmp_path: Path) -> None:
    denylist = script(tmp_path, "deny-rm.sh", CLAUDE_DENYLIST)
    hooks, _ = hooks_of(
        tmp_path,
        {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": str(denylist)}]}]},
    )
    denied = await hooks.pre_tool_use("c1", "shell", {"command": "rm -rf /workspace/build"})
    allowed = await hooks.pre_tool_use("c2", "shell", {"command": "ls -la"})
    assert denied.deny is not None and "rm -rf is not allowed" in denied.deny
    assert allowed.deny is None


async def test_a_timeout_kills_the_hook_and_its_children_and_changes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    slow = script(tmp_path, "slow.sh", f"sleep 60 &\necho $! > {marker}\nwait\n")
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", slow, timeout=1))
    started = time.monotonic()
    verdict = await hooks.pre_tool_use("c1", "shell", {"command": "ls"})
    assert time.monotonic() - started < 30
    assert verdict.deny is None and verdict.arguments is None
    event = seen[0]
    assert event.failed and event.timed_out and event.exit_code is None and "timed out" in event.reason
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # killed with its group: gone (or a zombie reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        status = Path(f"/proc/{child}/status")
        if status.exists() and "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hook's child outlived its timeout")
    assert "timed out" in (hook_line(event) or "")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("echo oops >&2\nexit 1\n", "exit 1: oops"),
        ("echo '{not json'\n", "not valid JSON"),
        ("exit 127\n", "exit 127"),
    ],
)
async def test_a_crashing_hook_is_named_and_never_blocks(tmp_path: Path, body: str, why: str) -> None:
    broken = script(tmp_path, "broken.sh", body)
    hooks, seen = hooks_of(
        tmp_path, {**one("PreToolUse", broken), **one("Stop", broken), **one("PreHandBack", broken)}
    )
    assert (await hooks.pre_tool_use("c1", "shell", {"command": "ls"})).deny is None
    assert (await hooks.stop("submitted", "done")).send_back is None
    assert await hooks.pre_hand_back(["a.py"], b"diff", "fixed") is None
    assert [e.failed for e in seen] == [True, True, True]
    assert all(why in e.reason for e in seen)


async def test_a_missing_command_is_a_named_failure(tmp_path: Path) -> None:
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", tmp_path / "no-such-hook"))
    assert (await hooks.pre_tool_use("c1", "shell", {"command": "ls"})).deny is None
    assert seen[0].failed and seen[0].exit_code == 127


async def test_huge_output_is_trimmed_and_escape_sequences_made_inert(tmp_path: Path) -> None:
    body = "head -c 5000000 /dev/zero | tr '\\0' 'x'\nprintf '\\033]0;pwned\\007\\033[2J%s' 'then stop' >&2\nexit 2\n"
    loud = script(tmp_path, "loud.sh", body)
    hooks, seen = hooks_of(tmp_path, one("PreToolUse", loud))
    verdict = await hooks.pre_tool_use("c1", "shell", {"command": "ls"})
    assert verdict.deny is not None and "\x1b" not in verdict.deny and "\\x1b" in verdict.deny
    assert len(verdict.deny) <= REASON_CHARS + 100
    event = seen[0]
    assert "\x1b" not in event.output_tail and "\x07" not in event.output_tail
    assert len(event.output_tail) < 3 * 1024
    assert f"{5_000_000 - READ_LIMIT} more bytes not kept" in event.output_tail
    assert "\x1b" not in (hook_line(event) or "")


async def test_post_tool_use_sees_the_result_and_its_block_reaches_the_model(tmp_path: Path) -> None:
    log = tmp_path / "post.jsonl"
    post = recorder(tmp_path, "post.sh", log, "echo 'run the formatter before going on' >&2\nexit 2\n")
    hooks, seen = hooks_of(tmp_path, one("PostToolUse", post, matcher="shell"))
    said = await hooks.post_tool_use("c1", "shell", {"command": "ls"}, "a.py\nb.py\n", True)
    assert said == "run the formatter before going on"
    given = logged(log)[0]
    assert given["tool_response"] == {"output": "a.py\nb.py\n", "success": True, "is_error": False}
    assert given["tool_input"]["command"] == "ls" and given["tool_name"] == "shell"
    assert seen[0].decided == "context"


async def test_stop_sends_back_then_stop_hook_active_and_a_cap(tmp_path: Path) -> None:
    log = tmp_path / "stop.jsonl"
    stop = recorder(
        tmp_path, "stop.sh", log, 'echo \'{"decision": "block", "reason": "the docs are not updated"}\'\n'
    )
    hooks, seen = hooks_of(tmp_path, one("Stop", stop))
    verdicts = [await hooks.stop("submitted", "done") for _ in range(MAX_SENDS_BACK + 1)]
    assert [v.send_back for v in verdicts[:MAX_SENDS_BACK]] == ["the docs are not updated"] * MAX_SENDS_BACK
    assert verdicts[-1].send_back is None  # the cap: the agent stops
    assert "ignored" in seen[-1].reason
    actives = [entry["stop_hook_active"] for entry in logged(log)]
    assert actives == [False] + [True] * MAX_SENDS_BACK


async def test_stop_exit_2_sends_back_with_stderr(tmp_path: Path) -> None:
    stop = script(tmp_path, "stop.sh", "cat >/dev/null\necho 'tests still fail: run them' >&2\nexit 2\n")
    hooks, _ = hooks_of(tmp_path, one("Stop", stop))
    assert (await hooks.stop("answered", "")).send_back == "tests still fail: run them"


async def test_pre_hand_back_veto_and_what_it_is_given(tmp_path: Path) -> None:
    log = tmp_path / "handback.jsonl"
    veto = recorder(tmp_path, "veto.sh", log, "echo 'not on a Friday' >&2\nexit 2\n")
    hooks, seen = hooks_of(tmp_path, one("PreHandBack", veto))
    said = await hooks.pre_hand_back(["src/a.py"], b"diff --git a/src/a.py b/src/a.py\n", "fixed")
    assert said is not None and said.startswith("not on a Friday")
    given = logged(log)[0]
    assert (
        given["files"] == ["src/a.py"]
        and given["verdict"] == "fixed"
        and given["patch"].startswith("diff --git")
    )
    assert seen[0].decided == "veto"


async def test_session_start_context_and_session_end(tmp_path: Path) -> None:
    log = tmp_path / "end.jsonl"
    start = script(tmp_path, "start.sh", "cat >/dev/null\necho 'The team uses tabs.'\n")
    end = recorder(tmp_path, "end.sh", log)
    hooks, _ = hooks_of(tmp_path, {**one("SessionStart", start), **one("SessionEnd", end)})
    assert await hooks.session_start("startup") == "The team uses tabs."
    await hooks.session_end("other")
    assert logged(log)[0]["reason"] == "other"


async def test_hooks_get_a_small_clean_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    dump = script(
        tmp_path,
        "env.py",
        f"#!/usr/bin/env python3\nimport json, os\njson.dump(dict(os.environ), open({str(out)!r}, 'w'))\n",
    )
    hooks, _ = hooks_of(tmp_path, one("SessionEnd", dump))
    hooks.environ = {**hooks.environ, "OPENAI_API_KEY": "secret"}
    await hooks.session_end("other")
    env = json.loads(out.read_text())
    assert "OPENAI_API_KEY" not in env
    assert env["CLOVER_PROJECT_DIR"] == env["CLAUDE_PROJECT_DIR"] == str(tmp_path / "repo")


def test_bad_tables_are_refused_with_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not an event"):
        parse_hooks({"BeforeAnything": [{"command": "x"}]}, origin="settings")
    with pytest.raises(ValueError, match="not a regular expression"):
        parse_hooks({"PreToolUse": [{"matcher": "(", "command": "x"}]}, origin="settings")
    with pytest.raises(ValueError, match="timeout"):
        parse_hooks({"Stop": [{"command": "x", "timeout": 0}]}, origin="settings")
    with pytest.raises(ValueError, match="runs on the host"):
        parse_hooks({"PreHandBack": [{"command": "x", "where": "sandbox"}]}, origin="settings")
    with pytest.raises(ValueError, match="unknown key"):
        parse_hooks({"Stop": [{"command": "x", "shell": True}]}, origin="settings")


async def test_session_start_matcher_is_tried_on_the_source_as_in_claude_code(tmp_path: Path) -> None:
    fresh = script(tmp_path, "fresh.sh", "cat >/dev/null\necho 'a new session'\n")
    again = script(tmp_path, "again.sh", "cat >/dev/null\necho 'taken up again'\n")
    tables = {
        "SessionStart": [
            {"matcher": "startup", "command": str(fresh)},
            {"matcher": "resume", "command": str(again)},
        ]
    }
    hooks, _ = hooks_of(tmp_path, tables)
    assert await hooks.session_start("startup") == "a new session"
    assert await hooks.session_start("resume") == "taken up again"


async def test_user_prompt_submit_blocks_or_adds_context(tmp_path: Path) -> None:
    """Exit 2 and ``decision: "block"`` keep a request from the model (with the reason); on exit 0,
    ``additionalContext`` or plain stdout is context; the hook reads the request as ``prompt``."""
    log = tmp_path / "prompts.jsonl"
    body = """import json, sys
data = json.load(sys.stdin)
open(sys.argv[1], "a").write(json.dumps(data) + "\\n")
prompt = data["prompt"]
if "password" in prompt:
    print("no secrets in requests", file=sys.stderr)
    sys.exit(2)
if "deploy" in prompt:
    print(json.dumps({"decision": "block", "reason": "deploys are done by CI"}))
elif "tabs" in prompt:
    print(json.dumps({"hookSpecificOutput": {"hookEventName": "UserPromptSubmit",
                                             "additionalContext": "The team uses tabs."}}))
else:
    print("Ticket: CLV-12")
"""
    hook = script(tmp_path, "screen.py", "#!/usr/bin/env python3\n" + body)
    hooks, seen = hooks_of(tmp_path, one("UserPromptSubmit", f"{hook} {log}"))
    secret = await hooks.user_prompt_submit("the password is hunter2")
    assert secret.blocked is not None and secret.blocked.startswith("no secrets in requests (blocked by")
    deploy = await hooks.user_prompt_submit("deploy it")
    assert deploy.blocked is not None and deploy.blocked.startswith("deploys are done by CI")
    assert await hooks.user_prompt_submit("indent with tabs") == PromptVerdict(context="The team uses tabs.")
    assert await hooks.user_prompt_submit("fix the test") == PromptVerdict(context="Ticket: CLV-12")
    given = logged(log)
    assert [g["prompt"] for g in given][:2] == ["the password is hunter2", "deploy it"]
    assert {g["hook_event_name"] for g in given} == {"UserPromptSubmit"}
    assert [e.decided for e in seen] == ["block", "block", "context", "context"]


async def test_a_failing_user_prompt_submit_hook_blocks_nothing(tmp_path: Path) -> None:
    crash = script(tmp_path, "crash.sh", "cat >/dev/null\nexit 3\n")
    hooks, seen = hooks_of(tmp_path, one("UserPromptSubmit", crash))
    assert await hooks.user_prompt_submit("fix it") == PromptVerdict()
    assert [e.failed for e in seen] == [True]


async def test_a_user_prompt_submit_hook_that_says_continue_false_stops_the_request(tmp_path: Path) -> None:
    """Claude Code's ``continue: false`` (with ``stopReason``) stops a prompt's processing: a ported
    hook that says it keeps the request from the model, not lets it through."""
    body = 'cat >/dev/null\necho \'{"continue": false, "stopReason": "outside working hours"}\'\n'
    hooks, seen = hooks_of(tmp_path, one("UserPromptSubmit", script(tmp_path, "stop.sh", body)))
    verdict = await hooks.user_prompt_submit("deploy it")
    assert verdict.blocked is not None and verdict.blocked.startswith("outside working hours (blocked by")
    assert [e.decided for e in seen] == ["block"]


async def test_a_user_prompt_submit_block_without_a_reason_names_the_hook_once(tmp_path: Path) -> None:
    quiet = script(tmp_path, "quiet.sh", "cat >/dev/null\nexit 2\n")
    hooks, _ = hooks_of(tmp_path, one("UserPromptSubmit", quiet))
    verdict = await hooks.user_prompt_submit("fix it")
    assert verdict.blocked is not None and verdict.blocked.count("UserPromptSubmit hook") == 1, verdict
    assert str(quiet) in verdict.blocked
