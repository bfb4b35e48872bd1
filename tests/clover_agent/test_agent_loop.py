"""The agent loop against real tools in a real local sandbox, driven by replayed assistant turns.

Every error path ends the same way: a clear message, a documented exit code, a ``done`` event as
the last line of the trajectory, and no exception out of ``Agent.run``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clover_agent.agent import Agent, Approvals, Budget, TrajectoryWriter, load_trajectory
from clover_agent.agent.condenser import Condenser
from clover_agent.agent.policy import preset
from clover_agent.agent.trajectory import read_events
from clover_agent.backends.replay import ReplayBackend
from clover_agent.errors import ExitCode
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    CheckpointTaken,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    EventBus,
    ModelDelta,
    ToolCallFinished,
)
from clover_agent.sandboxes.factory import create_sandbox
from tests.git_repos import git, make_repo
from tests.sandbox_specs import sandbox_spec


def call(name: str, **params: object) -> str:
    """An assistant text with one tool call in the Qwen3.6 format."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


VIEW = call("editor", command="view", path="/workspace/greet.py")
FINISH = call("finish", summary="done")


def write_replay(path: Path, turns: list[str]) -> Path:
    path.write_text("".join(json.dumps({"content": t}) + "\n" for t in turns))
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})


async def run_agent(repo: Path, tmp_path: Path, turns: list[str], *, resume=None, subscriber=None, **options):
    """Run the loop on ``turns``; returns (result, events read back from the trajectory file)."""
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    if subscriber is not None:
        bus.subscribe(subscriber)
    backend = ReplayBackend(write_replay(tmp_path / f"replay-{time.monotonic_ns()}.jsonl", turns))
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        agent = Agent(backend, sandbox, bus, run_id="test", **options)
        result = await agent.run("Say hello properly.", "You are a test agent.", resume=resume)
    writer.close()
    events = read_events(trajectory)
    assert isinstance(events[-1], Done)
    assert events[-1].exit_code == result.exit_code
    return result, events


def messages_of(events) -> list[dict]:
    return [e.message for e in events if e.type == "message_added"]


async def test_a_run_that_edits_and_finishes(repo: Path, tmp_path: Path) -> None:
    turns = [
        "<think>\nLook first.\n</think>\n\nReading the file.\n\n" + VIEW,
        call(
            "editor",
            command="str_replace",
            path="/workspace/greet.py",
            old_str="'hello '",
            new_str="'Hello, '",
        ),
        call("finish", summary="Capitalised the greeting."),
    ]
    emitted: list = []
    result, events = await run_agent(repo, tmp_path, turns, subscriber=emitted.append)
    assert result.submitted and result.exit_code == ExitCode.OK
    assert result.summary == "Capitalised the greeting."
    assert "+    return 'Hello, ' + name" in result.patch
    assert result.stats["steps"] == 3 and result.stats["checkpoints"] == 1
    deltas = [e for e in emitted if isinstance(e, ModelDelta)]
    assert [d.kind for d in deltas[:2]] == ["reasoning", "text"]
    # The trajectory reads back as emitted, less the streamed text (the turns hold it).
    assert events == [e for e in emitted if not isinstance(e, ModelDelta)]
    (checkpoint,) = [e for e in events if isinstance(e, CheckpointTaken)]
    assert checkpoint.turn == 2 and checkpoint.tool == "editor:str_replace" and len(checkpoint.commit) == 40


async def test_malformed_call_is_fed_back_and_the_run_goes_on(repo: Path, tmp_path: Path) -> None:
    broken = "<tool_call>\n<function=editor>\n<parameter=command>\nview\n"  # never closed
    result, events = await run_agent(repo, tmp_path, [broken, VIEW, FINISH])
    assert result.submitted
    (error,) = [e for e in events if isinstance(e, ErrorReported)]
    assert error.kind == "format" and not error.fatal
    messages = messages_of(events)
    assert messages[3]["role"] == "user" and messages[3]["content"] == error.message
    assert "tool call" in error.message.lower()


async def test_unknown_tool_and_invalid_arguments_are_errors_for_the_model(
    repo: Path, tmp_path: Path
) -> None:
    turns = [
        call("delete_everything", path="/"),
        call("editor", command="explode", path="/workspace/greet.py"),
        call("editor", command="view", path="/etc/passwd"),
        FINISH,
    ]
    result, events = await run_agent(repo, tmp_path, turns)
    assert result.submitted
    texts = [e.message for e in events if isinstance(e, ErrorReported)] + [
        e.output for e in events if isinstance(e, ToolCallFinished) and e.is_error
    ]
    assert any("delete_everything" in t for t in texts), texts
    assert any("explode" in t for t in texts), texts
    assert any("/etc/passwd" in t for t in texts), texts


async def test_tool_timeout_is_reported_and_the_sandbox_stays_usable(repo: Path, tmp_path: Path) -> None:
    turns = [call("shell", command="sleep 600", timeout=1), call("shell", command="echo still-here"), FINISH]
    started = time.monotonic()
    result, events = await run_agent(repo, tmp_path, turns)
    assert time.monotonic() - started < 300  # the 1 s timeout, not `sleep 600`
    assert result.submitted
    first, second = [e for e in events if isinstance(e, ToolCallFinished)][:2]
    assert first.is_error and "timed out" in first.output
    assert not second.is_error and "still-here" in second.output


async def test_step_budget_stops_before_the_next_call(repo: Path, tmp_path: Path) -> None:
    result, events = await run_agent(repo, tmp_path, [VIEW] * 2 + [FINISH], budget=Budget(max_steps=2))
    assert result.outcome == "budget_exhausted" and result.exit_code == ExitCode.BUDGET_EXHAUSTED
    assert "step budget exhausted" in result.message
    assert [e.resource for e in events if e.type == "budget_warning"] == ["steps"]
    assert sum(1 for e in events if e.type == "model_responded") == 2


async def test_replay_exhausted_is_an_agent_error(repo: Path, tmp_path: Path) -> None:
    result, events = await run_agent(repo, tmp_path, [VIEW])
    assert result.outcome == "error" and result.exit_code == ExitCode.AGENT_ERROR
    assert "no turn left" in result.message
    fatal = [e for e in events if isinstance(e, ErrorReported) and e.fatal]
    assert fatal and fatal[0].exit_code == ExitCode.AGENT_ERROR


async def test_a_sandbox_dying_mid_call_ends_the_run_with_exit_4(repo: Path, tmp_path: Path) -> None:
    turns = [call("shell", command="kill -9 $PPID; sleep 30"), VIEW, FINISH]  # the first kills the runner
    result, events = await run_agent(repo, tmp_path, turns)
    assert result.outcome == "error" and result.exit_code == ExitCode.SANDBOX_UNAVAILABLE
    assert result.message.startswith("the sandbox stopped working during the shell call")
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]  # no call after the loss
    assert finished.is_error and "sandbox stopped working" in finished.output


async def test_repeating_the_same_call_gets_one_nudge_then_stops(repo: Path, tmp_path: Path) -> None:
    result, events = await run_agent(repo, tmp_path, [VIEW] * 6)
    assert result.outcome == "stuck" and result.exit_code == ExitCode.AGENT_ERROR
    nudges = [m for m in messages_of(events) if m["role"] == "user" and "change course" in m["content"]]
    assert len(nudges) == 1
    assert sum(1 for e in events if e.type == "model_responded") == 4  # 3 → nudge, the 4th stops


async def test_policy_denials_and_asks_without_terminal_are_recorded(repo: Path, tmp_path: Path) -> None:
    turns = [call("shell", command="pip install requests"), FINISH]
    result, events = await run_agent(repo, tmp_path, turns, policy=preset("workspace"), approvals=None)
    assert result.submitted
    (asked,) = [e for e in events if isinstance(e, ApprovalRequested)]
    (decided,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert asked.name == "shell" and not decided.approved and decided.decided_by == "no-terminal"
    denied = next(e for e in events if isinstance(e, ToolCallFinished))
    assert denied.is_error and "not allowed" in denied.output

    asked_about = []
    approvals = Approvals()

    def approve(event: Event) -> None:  # a person answering at once, by call id
        if isinstance(event, ApprovalRequested):
            asked_about.append(event.arguments["command"])
            approvals.answer(event.call_id, "once")

    turns = [call("shell", command="git push --dry-run origin main || true"), FINISH]
    result, events = await run_agent(repo, tmp_path / "yes", turns, approvals=approvals, subscriber=approve)
    assert asked_about == ["git push --dry-run origin main || true"]
    (decided,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert decided.approved and decided.decided_by == "user" and decided.answer == "once"
    assert [e.type for e in events].count("checkpoint_taken") == 1  # it ran, after a snapshot

    turns = [call("editor", command="create", path="/workspace/new.py", file_text="x = 1"), FINISH]
    result, events = await run_agent(repo, tmp_path / "ro", turns, policy=preset("read-only"))
    assert result.patch == ""  # nothing was written
    (decided,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert decided.decided_by == "policy" and "read-only" in decided.reason


async def test_condensation_in_the_loop_drops_old_outputs_with_a_note(repo: Path, tmp_path: Path) -> None:
    (repo / "big.txt").write_text("".join(f"line {i} of a long file\n" for i in range(400)))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "big")
    view_big = call("editor", command="view", path="/workspace/big.txt")
    view_small = VIEW
    backend = ReplayBackend(write_replay(tmp_path / "sizes.jsonl", [FINISH]))
    from clover_agent.tools.registry import tool_specs

    base = backend.count_tokens(
        [
            {"role": "system", "content": "You are a test agent."},
            {"role": "user", "content": "Say hello properly."},
        ],
        tool_specs(),
    )
    condenser = Condenser(base + 4000, reply_tokens=0, threshold=1.0, keep_recent=2)
    turns = [view_big, view_small, view_small.replace("greet.py", ""), FINISH]
    result, events = await run_agent(repo, tmp_path, turns, condenser=condenser, stuck_repeats=10)
    assert result.submitted
    (condensed,) = [e for e in events if isinstance(e, ContextCondensed)]
    assert condensed.tokens_after < condensed.tokens_before
    assert any("big.txt" in d for d in condensed.dropped)
    assert condensed.messages[-1]["content"] == condensed.note and "big.txt" in condensed.note
    # The resume state sees the condensed conversation, note included.
    state = load_trajectory(tmp_path / "run" / "trajectory.jsonl")
    assert any(m["content"] == condensed.note for m in state.messages)
    assert not any("line 399 of a long file" in str(m.get("content")) for m in state.messages)


async def test_a_resumed_run_continues_the_conversation_and_the_workspace(repo: Path, tmp_path: Path) -> None:
    create = call("editor", command="create", path="/workspace/notes.md", file_text="draft")
    edit = call("editor", command="str_replace", path="/workspace/notes.md", old_str="draft", new_str="final")
    first, _ = await run_agent(repo, tmp_path, [create, VIEW, edit, FINISH], budget=Budget(max_steps=2))
    assert first.exit_code == ExitCode.BUDGET_EXHAUSTED
    state = load_trajectory(tmp_path / "run" / "trajectory.jsonl")
    assert state.steps == 2 and state.last_outcome == "budget_exhausted"
    assert [m["role"] for m in state.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert "notes.md" in state.patch

    # A new sandbox and backend; the replay holds only the turns not yet taken.
    second, events = await run_agent(repo, tmp_path, [edit, FINISH], resume=state, budget=Budget(max_steps=5))
    assert second.submitted, second.message
    assert second.stats["steps"] == 4  # counted on from the first run
    assert "+final" in second.patch  # the edit found the file the first run created
    resumed = load_trajectory(tmp_path / "run" / "trajectory.jsonl")
    assert resumed.messages[: len(state.messages)] == state.messages
    assert len(resumed.messages) == len(state.messages) + 4
    assert [e.type for e in events].count("run_started") == 2


async def test_time_budget_cuts_a_model_call_that_hangs(repo: Path, tmp_path: Path) -> None:
    import socket

    from clover_agent.backends import create_backend

    with socket.socket() as server:  # accepts connections (backlog) and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        backend = create_backend(
            "openai", base_url=f"http://127.0.0.1:{server.getsockname()[1]}/v1", retries=0
        )
        bus = EventBus()
        events: list = []
        bus.subscribe(events.append)
        started = time.monotonic()
        async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
            agent = Agent(backend, sandbox, bus, run_id="hang", budget=Budget(max_time_s=1.5))
            result = await agent.run("Say hello properly.", "You are a test agent.")
        await backend.close()
    assert time.monotonic() - started < 300  # cut by the 1.5 s budget, not the 600 s read timeout
    assert result.outcome == "budget_exhausted" and "during a model call" in result.message
    assert isinstance(events[-1], Done) and events[-1].exit_code == ExitCode.BUDGET_EXHAUSTED


async def test_the_model_sees_head_and_tail_and_the_trajectory_keeps_everything(
    repo: Path, tmp_path: Path
) -> None:
    loud = call("shell", command="seq 1 20000")  # ~108 KB of output
    result, events = await run_agent(repo, tmp_path, [loud, FINISH])
    assert result.submitted
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished) and e.name == "shell"]
    assert "bytes omitted" in finished.output and "\n10000\n" not in finished.output
    assert finished.output.startswith("1\n2\n3\n") and "\n20000\n" in finished.output
    assert finished.full_output == "".join(f"{i}\n" for i in range(1, 20001))  # full fidelity
    assert finished.data["exit_code"] == 0 and "output" not in finished.data  # kept once, not twice
    (tool_message,) = [m for m in messages_of(events) if m["role"] == "tool" and m["name"] == "shell"]
    assert tool_message["content"] == finished.output  # what the model was given


async def test_a_lone_surrogate_in_the_model_text_is_recorded_and_read_back(
    repo: Path, tmp_path: Path
) -> None:
    """Model text with a lone surrogate (no UTF-8 form) used to crash the trajectory writer; it is
    written as its JSON escape and reads back to the same text."""
    odd = "Reading \udc80 the file \\\udcff.\n\n"
    result, events = await run_agent(repo, tmp_path, [odd + VIEW, FINISH])
    assert result.submitted
    (first,) = [e for e in events if e.type == "model_responded" and e.step == 1]
    assert first.raw.startswith(odd) and first.content == odd.strip()
    raw = (tmp_path / "run" / "trajectory.jsonl").read_bytes()
    raw.decode("utf-8")  # the file is valid UTF-8
    assert b"\\udc80" in raw
