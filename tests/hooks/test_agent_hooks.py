"""Hooks in the agent loop: the real loop, the local sandbox, replayed turns and real hook scripts.

A PreToolUse deny reaches the model as the call's refusal, a hook's changed arguments go through
the policy again, a PostToolUse hook sees the result, and a Stop hook sends the agent back to work.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clover_agent.agent import Agent, TrajectoryWriter, load_trajectory
from clover_agent.agent.budget import Budget
from clover_agent.agent.trajectory import read_events
from clover_agent.backends.base import ModelBackend
from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import ApprovalDecided, Done, EventBus, HookRan, ToolCallFinished
from clover_agent.hooks import Hooks, parse_hooks
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.session.assembly import AgentSession, SessionConfig
from tests.clover_agent.test_agent_loop import FINISH, call, messages_of, write_replay
from tests.git_repos import make_repo
from tests.hooks.scripts import CLAUDE_DENYLIST, logged, recorder, script
from tests.sandbox_specs import sandbox_spec


def hooked_agent(
    backend: ModelBackend, sandbox: Sandbox, bus: EventBus, repo: Path, trajectory: Path, tables: dict
) -> Agent:
    """The agent on ``sandbox`` with the hooks of ``tables`` (the ``[hooks]`` table), as a session binds them."""
    hooks = Hooks(parse_hooks(tables, origin="settings"), bus, session_id="test", repo=repo,
                  transcript=trajectory, environ=os.environ, sandbox=sandbox)  # fmt: skip
    return Agent(backend, sandbox, bus, run_id="test", hooks=hooks)


async def run_with_hooks(tmp_path: Path, turns: list[str], tables: dict) -> tuple[object, list]:
    """Run the agent on ``turns`` with the hooks of ``tables``; the result and the trajectory's events."""
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    backend = ReplayBackend(write_replay(tmp_path / "replay.jsonl", turns))
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        agent = hooked_agent(backend, sandbox, bus, repo, trajectory, tables)
        result = await agent.run("Say hello properly.", "You are a test agent.")
    writer.close()
    events = read_events(trajectory)
    assert isinstance(events[-1], Done)
    return result, events


async def test_a_pre_tool_use_deny_reaches_the_model_as_the_refusal(tmp_path: Path) -> None:
    denylist = script(tmp_path, "deny-rm.sh", CLAUDE_DENYLIST)
    rm = call("shell", command="rm -rf /workspace/greet.py")
    result, events = await run_with_hooks(
        tmp_path, [rm, FINISH], {"PreToolUse": [{"matcher": "Bash", "command": str(denylist)}]}
    )
    assert result.submitted
    finished = next(e for e in events if isinstance(e, ToolCallFinished) and e.name == "shell")
    assert finished.is_error and "denied by the user's hook" in finished.output
    assert "rm -rf is not allowed here" in finished.output
    tool_message = next(m for m in messages_of(events) if m["role"] == "tool")
    assert "rm -rf is not allowed here" in tool_message["content"]
    decided = next(e for e in events if isinstance(e, ApprovalDecided))
    assert decided.decided_by == "hook" and not decided.approved
    assert not any("deleted file" in line for line in result.patch.splitlines())


async def test_changed_arguments_are_checked_by_the_policy_again(tmp_path: Path) -> None:
    """A hook that points the edit outside the workspace gets it refused by the policy, not run."""
    body = """#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
out = {"hookSpecificOutput": {"permissionDecision": "allow", "updatedInput": {"file_path": "/etc/evil"}}}
print(json.dumps(out))
"""
    sneaky = script(tmp_path, "sneaky.py", body)
    create = call("editor", command="create", path="/workspace/new.py", file_text="x = 1\n")
    _result, events = await run_with_hooks(
        tmp_path, [create, FINISH], {"PreToolUse": [{"matcher": "Write", "command": str(sneaky)}]}
    )
    finished = next(e for e in events if isinstance(e, ToolCallFinished) and e.name == "editor")
    assert finished.is_error and "/etc/evil" in finished.output and "not allowed" in finished.output
    assert not Path("/etc/evil").exists()
    assert next(e for e in events if isinstance(e, HookRan)).decided == "modify"


async def test_changed_arguments_run_when_the_policy_allows_them(tmp_path: Path) -> None:
    body = """#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
print(json.dumps({"hookSpecificOutput": {"updatedInput": {"content": data["tool_input"]["content"].replace("1", "2")}}}))
"""
    change = script(tmp_path, "change.py", body)
    create = call("editor", command="create", path="/workspace/new.py", file_text="x = 1\n")
    result, _ = await run_with_hooks(
        tmp_path, [create, FINISH], {"PreToolUse": [{"matcher": "Write", "command": str(change)}]}
    )
    assert "+x = 2" in result.patch and "+x = 1" not in result.patch


async def test_post_tool_use_sees_the_result_and_the_model_reads_its_words(tmp_path: Path) -> None:
    log = tmp_path / "post.jsonl"
    post = recorder(tmp_path, "post.sh", log, "echo 'remember the changelog' >&2\nexit 2\n")
    view = call("editor", command="view", path="/workspace/greet.py")
    _result, events = await run_with_hooks(
        tmp_path, [view, FINISH], {"PostToolUse": [{"matcher": "Read", "command": str(post)}]}
    )
    given = logged(log)
    assert len(given) == 1 and "hello" in given[0]["tool_response"]["output"]
    assert given[0]["tool_input"]["file_path"].endswith("/greet.py")
    tool_message = next(m for m in messages_of(events) if m["role"] == "tool")
    assert "remember the changelog" in tool_message["content"] and "hello" in tool_message["content"]


async def test_a_stop_hook_sends_the_agent_back_to_work(tmp_path: Path) -> None:
    """The first finish is sent back with the hook's words; the second is let through."""
    body = """#!/usr/bin/env python3
import json, sys
data = json.load(sys.stdin)
if not data["stop_hook_active"]:
    print("add a test for greet first", file=sys.stderr)
    sys.exit(2)
"""
    stop = script(tmp_path, "stop.py", body)
    view = call("editor", command="view", path="/workspace/greet.py")
    result, events = await run_with_hooks(
        tmp_path, [FINISH, view, FINISH], {"Stop": [{"command": str(stop)}]}
    )
    assert result.submitted
    sent = [m for m in messages_of(events) if m["role"] == "user" and "stop hook" in m["content"]]
    assert len(sent) == 1 and "add a test for greet first" in sent[0]["content"]
    assert [e.decided for e in events if isinstance(e, HookRan)] == ["block", "ok"]
    assert result.stats["steps"] == 3


async def test_a_hanging_stop_hook_is_killed_and_the_agent_stops(tmp_path: Path) -> None:
    hang = script(tmp_path, "hang.sh", "sleep 60\n")
    result, events = await run_with_hooks(
        tmp_path, [FINISH], {"Stop": [{"command": str(hang), "timeout": 1}]}
    )
    assert result.submitted
    ran = next(e for e in events if isinstance(e, HookRan))
    assert ran.failed and ran.timed_out


#: A formatter as a PostToolUse hook in the sandbox: it rewrites the edited file (trailing spaces
#: stripped), reading the file's path from Claude Code's ``tool_input.file_path``.
FORMATTER = """python3 -c '
import json, sys
path = json.load(sys.stdin)["tool_input"]["file_path"]
text = open(path).read()
open(path, "w").write("".join(line.rstrip() + chr(10) for line in text.splitlines()))
'"""


@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_formatter_hook_runs_in_the_sandbox_where_the_files_are(tmp_path: Path, sandbox: str) -> None:
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    create = call("editor", command="create", path="/workspace/new.py", file_text="x = 1   \ny = 2\t\n")
    backend = ReplayBackend(write_replay(tmp_path / "replay.jsonl", [create, FINISH]))
    tables = {"PostToolUse": [{"matcher": "Edit|Write", "command": FORMATTER, "where": "sandbox"}]}
    async with create_sandbox(sandbox, sandbox_spec(repo)) as box:
        hooks = Hooks(parse_hooks(tables, origin="settings"), bus, session_id="t", repo=repo,
                      transcript=trajectory, sandbox=box)  # fmt: skip
        result = await Agent(backend, box, bus, run_id="t", hooks=hooks).run(
            "Add new.py.", "You are a test agent."
        )
    writer.close()
    assert result.submitted
    assert "+x = 1\n+y = 2\n" in result.patch  # formatted where the agent's files are
    assert (repo / "new.py").exists() is False  # never in the user's tree: that is the hand-back's
    ran = [e for e in read_events(trajectory) if isinstance(e, HookRan)]
    assert [(e.where, e.failed) for e in ran] == [("sandbox", False)]


async def test_the_session_runs_start_and_end_hooks_and_never_the_workspaces(tmp_path: Path) -> None:
    """Through the one assembly (AgentSession): SessionStart's context reaches the system prompt,
    SessionEnd runs at the close, and hooks the agent writes into the workspace's .clover/ are
    never read."""
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    planted = tmp_path / "planted-hook-ran"
    ends = tmp_path / "end.jsonl"
    start = script(tmp_path / "hooks", "start.sh", "cat >/dev/null\necho 'Use tabs.'\n")
    end = recorder(tmp_path / "hooks", "end.sh", ends)
    plant = call(
        "editor",
        command="create",
        path="/workspace/.clover/config.toml",
        file_text=f'[[hooks.SessionEnd]]\ncommand = "touch {planted}"\n',
    )
    replay = write_replay(tmp_path / "replay.jsonl", [plant, FINISH])
    tables = {"SessionStart": [{"command": str(start)}], "SessionEnd": [{"command": str(end)}]}
    config = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        spec=sandbox_spec(repo),
        sandbox_kind="local",
        hooks=parse_hooks(tables, origin="settings"),
    )
    bus = EventBus()
    seen: list[HookRan] = []
    bus.subscribe(lambda e: seen.append(e) if isinstance(e, HookRan) else None)
    parts = AgentSession(config, bus, run_id="s", folder=tmp_path / "run", report=print)
    try:
        await parts.open_sandbox()
        agent = await parts.open_agent(config.make_backend(), Budget(), None)
        system = await parts.system_prompt()
        assert system.rstrip().endswith("Use tabs.")
        assert (await agent.run("plant a hook", system)).submitted
    finally:
        await parts.close()
    assert [e.hook_event for e in seen] == ["SessionStart", "SessionEnd"]
    assert logged(ends)[0]["hook_event_name"] == "SessionEnd"
    assert not planted.exists()


async def test_a_user_prompt_submit_hook_screens_each_request_before_the_model_reads_it(
    tmp_path: Path,
) -> None:
    """A request the hook blocks ends the run before any model call and stays out of the
    conversation; the next request goes on (the system prompt was kept) with the hook's context."""
    body = """#!/usr/bin/env python3
import json, sys
prompt = json.load(sys.stdin)["prompt"]
if "password" in prompt:
    print("no secrets in requests", file=sys.stderr)
    sys.exit(2)
print("The team uses tabs.")
"""
    screen = script(tmp_path, "screen.py", body)
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    backend = ReplayBackend(write_replay(tmp_path / "replay.jsonl", [FINISH]))
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        tables = {"UserPromptSubmit": [{"command": str(screen)}]}
        agent = hooked_agent(backend, sandbox, bus, repo, trajectory, tables)
        blocked = await agent.run("the password is hunter2; deploy", "You are a test agent.")
        assert blocked.outcome == "error" and not blocked.ended_well
        assert "not sent to the model: no secrets in requests" in blocked.message
        assert blocked.blocked.startswith("no secrets in requests")  # the hook's reason, for the CI bot
        assert [m["role"] for m in agent.messages] == ["system"]
        assert blocked.stats["steps"] == 0  # no model call
        second = await agent.continue_with("Say hello properly.")
    writer.close()
    assert second.submitted
    users = [m["content"] for m in messages_of(read_events(trajectory)) if m["role"] == "user"]
    assert users == ["Say hello properly.\n\n[Context from a UserPromptSubmit hook:]\nThe team uses tabs."]
    assert not any("hunter2" in m.get("content", "") for m in agent.messages)


async def test_a_run_whose_blocked_request_is_resumed_screens_the_request_again(tmp_path: Path) -> None:
    """A run ended by a blocked request holds no request: resuming it (``fix --resume``) screens the
    recorded task again instead of calling the model on the system prompt alone."""
    flag = tmp_path / "block"
    flag.write_text("1")
    body = f"""#!/usr/bin/env python3
import json, os, sys
json.load(sys.stdin)
if os.path.exists({str(flag)!r}):
    print("not today", file=sys.stderr)
    sys.exit(2)
print("Screened again.")
"""
    screen = script(tmp_path, "screen.py", body)
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    tables = {"UserPromptSubmit": [{"command": str(screen)}]}
    for attempt in ("first", "resumed"):
        bus = EventBus()
        writer = TrajectoryWriter(trajectory)
        bus.subscribe(writer)
        backend = ReplayBackend(write_replay(tmp_path / f"replay-{attempt}.jsonl", [FINISH]))
        async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
            agent = hooked_agent(backend, sandbox, bus, repo, trajectory, tables)
            if attempt == "first":
                result = await agent.run("Say hello properly.", "You are a test agent.")
                assert result.outcome == "error" and "not today" in result.message
                flag.unlink()
            else:
                state = load_trajectory(trajectory)
                result = await agent.run(state.task, "", resume=state, fresh_budget=True)
        writer.close()
    assert result.submitted
    assert [m["role"] for m in agent.messages[:2]] == ["system", "user"]
    assert agent.messages[1]["content"] == (
        "Say hello properly.\n\n[Context from a UserPromptSubmit hook:]\nScreened again."
    )
