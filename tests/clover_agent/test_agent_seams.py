"""The seams an interactive front end drives, each from its own task on the agent's event loop, with
real tools in real sandboxes and replayed turns: approvals answered by call id, an interrupt during
a tool call and during a model call, a user message sent mid-run, a new request after ``finish``,
undo to an earlier step, and tools the agent is given (which declare what mutates)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from clover_agent.agent import Agent, Approvals, Budget, TrajectoryWriter, load_trajectory
from clover_agent.agent.checkpoints import WorkspaceCheckpointError
from clover_agent.agent.policy import preset
from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallInterrupted,
    CheckpointTaken,
    ErrorReported,
    Event,
    EventBus,
    ModelDelta,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    WorkspaceChanged,
    WorkspaceUndone,
)
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.base import Tool, ToolContext, ToolResult
from clover_agent.tools.registry import default_tools
from tests.clover_agent.test_agent_loop import FINISH, VIEW, call
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

#: Generous: these wait on events, and a loaded machine may take long to produce them.
DEADLINE_S = 120


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def sandbox(request: pytest.FixtureRequest, repo: Path) -> AsyncIterator[Sandbox]:
    async with create_sandbox(request.param, sandbox_spec(repo)) as box:
        yield box


def replay(path: Path, *turns: str | dict[str, Any]) -> ReplayBackend:
    lines = [turn if isinstance(turn, dict) else {"content": turn} for turn in turns]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return ReplayBackend(path)


class Recorder:
    """Every event, and a way to wait for one."""

    def __init__(self, bus: EventBus) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Event()
        bus.subscribe(self)

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        self._changed.set()

    async def nth(self, n: int, kind: type, **fields: Any) -> Any:
        """The ``n``-th event (1-based) of ``kind`` with ``fields``, once it has been emitted."""
        async with asyncio.timeout(DEADLINE_S):
            while True:
                found = [e for e in self.of(kind) if all(getattr(e, k) == v for k, v in fields.items())]
                if len(found) >= n:
                    return found[n - 1]
                self._changed.clear()
                await self._changed.wait()

    async def first(self, kind: type, **fields: Any) -> Any:
        return await self.nth(1, kind, **fields)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def conversation(agent: Agent) -> list[tuple[str, str]]:
    return [(m["role"], str(m.get("content", ""))) for m in agent.messages]


async def test_approvals_are_requested_first_and_answered_by_call_id(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    install = call("shell", command="pip install --help > /dev/null; echo asked-and-ran")
    backend = replay(tmp_path / "asks.jsonl", install, install, install, install, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    approvals = Approvals()
    agent = Agent(
        backend, sandbox, bus, run_id="ask", policy=preset("workspace"), approvals=approvals, stuck_repeats=10
    )
    run = asyncio.create_task(agent.run("Install it.", "You are a test agent."))
    for n, answer in enumerate(["deny", "once", "always"], 1):  # the fourth call: covered by "always"
        request = await seen.nth(n, ApprovalRequested)
        # Announced before it is decided: the agent waits, the call has not run.
        assert approvals.pending == [request.call_id]
        assert not any(e.call_id == request.call_id for e in seen.of(ApprovalDecided))
        assert not any(e.call_id == request.call_id for e in seen.of(ToolCallFinished))
        assert agent.answer_approval(request.call_id, answer)
        assert not agent.answer_approval(request.call_id, "once")  # answered already
    result = await asyncio.wait_for(run, DEADLINE_S)
    assert result.submitted, result.message
    decided = [(e.approved, e.decided_by, e.answer) for e in seen.of(ApprovalDecided)]
    assert decided == [
        (False, "user", "deny"),
        (True, "user", "once"),
        (True, "user", "always"),
        (True, "remembered", None),
    ]
    outputs = [e.output for e in seen.of(ToolCallFinished)]
    assert "not allowed" in outputs[0] and all("asked-and-ran" in o for o in outputs[1:4])
    assert len(seen.of(ApprovalRequested)) == 3


async def test_a_denial_with_feedback_reaches_the_model_and_always_says_its_scope(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    install = call("shell", command="pip install left-pad")
    backend = replay(tmp_path / "feedback.jsonl", install, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="fb", policy=preset("workspace"), approvals=Approvals())
    run = asyncio.create_task(agent.run("Pad it.", "You are a test agent."))
    request = await seen.first(ApprovalRequested)
    assert request.always == (
        "`shell` running exactly `pip install left-pad` again, without asking, "
        "for the rest of this session under the 'workspace' policy"
    )
    assert agent.answer_approval(request.call_id, "deny", "  no: write the padding yourself  ")
    assert (await asyncio.wait_for(run, DEADLINE_S)).submitted
    (decided,) = seen.of(ApprovalDecided)
    assert (decided.approved, decided.answer, decided.feedback) == (
        False,
        "deny",
        "no: write the padding yourself",
    )
    tool = [text for role, text in conversation(agent) if role == "tool"]
    assert "no: write the padding yourself" in tool[0] and "pip install left-pad" in tool[0]


async def test_no_one_to_ask_means_denied(sandbox: Sandbox, tmp_path: Path) -> None:
    backend = replay(tmp_path / "no-one.jsonl", call("shell", command="curl https://example.com"), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="none", policy=preset("workspace"))
    assert (await agent.run("Fetch it.", "You are a test agent.")).submitted
    (decided,) = seen.of(ApprovalDecided)
    assert (decided.approved, decided.decided_by) == (False, "no-terminal")


async def test_an_interrupt_stops_a_running_tool_and_a_correction_follows(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    marker = f"/tmp/started-{uuid.uuid4().hex}"  # the local sandbox's /tmp is the host's
    # A sleep of its own: the local sandbox's `ps` lists the host's processes, the docker variant's
    # sleep among them when the two run side by side on two workers.
    sleep = f"sleep 600.{uuid.uuid4().int % 10**6:06d}"
    hang = call("shell", command=f"touch {marker} && {sleep} && echo never")
    backend = replay(tmp_path / "hang.jsonl", hang, VIEW, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="stop-tool")
    run = asyncio.create_task(agent.run("Wait, then look.", "You are a test agent."))
    await seen.first(ToolCallStarted, name="shell")
    async with asyncio.timeout(DEADLINE_S):  # the command itself is running (its marker exists)
        while (await sandbox.exec(f"test -e {marker}")).exit_code != 0:
            await asyncio.sleep(0.1)
    assert agent.interrupt()
    interrupted = await seen.first(CallInterrupted)
    finished = await seen.first(ToolCallFinished, name="shell")
    assert interrupted.during == "tool" and finished.is_error and "interrupted" in finished.output
    # The command's processes are gone from the sandbox, and the run did not end: it waits.
    listing = await sandbox.exec("ps -eo args")
    assert sleep not in listing.output
    await sandbox.exec(f"rm -f {marker}")
    await asyncio.sleep(0)
    assert not run.done() and agent.steering.paused
    agent.send("Do not wait; just look at the file.")
    result = await asyncio.wait_for(run, DEADLINE_S)
    assert result.submitted, result.message
    talk = conversation(agent)
    stopped = talk.index(("tool", finished.output))
    assert talk[stopped + 1] == ("user", "Do not wait; just look at the file.")
    assert talk[stopped + 2][0] == "assistant"


async def test_an_interrupt_cancels_a_model_call_cleanly(sandbox: Sandbox, tmp_path: Path) -> None:
    slow = {"content": "<think>\nThinking for a long time about it.\n</think>\n\n" + VIEW, "seconds": 600}
    backend = replay(tmp_path / "slow.jsonl", slow, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="stop-model")
    run = asyncio.create_task(agent.run("Think.", "You are a test agent."))
    await seen.first(ModelDelta)  # the model is writing
    started = time.monotonic()
    assert agent.interrupt("Stop thinking and finish.")
    result = await asyncio.wait_for(run, DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S  # not the 600 s the turn would take
    assert result.submitted
    (interrupted,) = seen.of(CallInterrupted)
    assert interrupted.during == "model"
    talk = conversation(agent)
    cut = talk.index(("user", "[The user interrupted your reply before it was complete; it was discarded.]"))
    assert talk[cut + 1] == ("user", "Stop thinking and finish.")
    assert not any("Thinking for a long time" in text for _, text in talk)  # the cut reply is gone


async def test_a_message_sent_mid_run_arrives_at_the_next_step(sandbox: Sandbox, tmp_path: Path) -> None:
    backend = replay(tmp_path / "steer.jsonl", VIEW, VIEW.replace("greet.py", ""), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="steer", stuck_repeats=10)
    run = asyncio.create_task(agent.run("Look around.", "You are a test agent."))
    await seen.first(ToolCallStarted)
    agent.send("Also list the folder.")
    assert (await asyncio.wait_for(run, DEADLINE_S)).submitted
    roles = [role for role, _ in conversation(agent)]
    # system, task, call 1, its result, the message (after the result, never between), call 2, ...
    assert roles[:6] == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert conversation(agent)[4] == ("user", "Also list the folder.")


async def test_the_conversation_goes_on_after_finish_and_undo_goes_back(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    create = call("editor", command="create", path="/workspace/notes.md", file_text="one")
    edit = call("editor", command="str_replace", path="/workspace/notes.md", old_str="one", new_str="two")
    backend = replay(tmp_path / "session.jsonl", create, FINISH, edit, FINISH, FINISH)
    bus = EventBus()
    trajectory = tmp_path / "run" / "trajectory.jsonl"
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="session", budget=Budget(max_steps=20))
    first = await agent.run("Write notes.", "You are a test agent.")
    assert first.submitted and "+one" in first.patch
    second = await agent.continue_with("Now change them to two.")  # same sandbox, same conversation
    assert second.submitted and "+two" in second.patch
    assert (await sandbox.read_file("/workspace/notes.md")) == b"two"
    steps = [e.turn for e in seen.of(CheckpointTaken)]
    assert steps == [1, 3]

    checkpoint = await agent.undo(3)  # back to before the edit of step 3
    assert checkpoint is not None and checkpoint.turn == 3
    assert (await sandbox.read_file("/workspace/notes.md")) == b"one"
    (undone,) = seen.of(WorkspaceUndone)
    assert undone.step == 3 and "editor:str_replace" in undone.undone
    role, note = conversation(agent)[-1]
    assert role == "user" and "undid the changes made since step 3" in note
    third = await agent.continue_with("Leave it like that.")
    assert third.submitted and "+one" in third.patch and "+two" not in third.patch
    writer.close()
    state = load_trajectory(trajectory)  # the whole session is one resumable conversation
    assert state.messages == agent.messages and "+one" in state.patch and state.steps == 5


class StampTool(Tool):
    """A tool of the test's own: it writes a stamp file, and says that it changes the workspace."""

    name = "stamp"
    description = "Write the stamp file."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    def mutates(self, args: dict[str, Any]) -> bool:
        return True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await ctx.sandbox.write_file("/workspace/stamp.txt", args["text"].encode())
        return ToolResult(True, "stamped")


async def test_the_agent_runs_the_tools_it_is_given(sandbox: Sandbox, tmp_path: Path) -> None:
    finish = next(t for t in default_tools() if t.name == "finish")
    backend = replay(tmp_path / "own.jsonl", VIEW, call("stamp", text="hi"), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="own", tools=[StampTool(), finish])
    result = await agent.run("Stamp it.", "You are a test agent.")
    assert result.submitted and "+hi" in result.patch
    assert [spec["function"]["name"] for spec in agent.tool_specs] == ["stamp", "finish"]
    # The editor is not among its tools: the call is a format error, never run.
    assert not any(e.name == "editor" for e in seen.of(ToolCallStarted))
    (checkpoint,) = seen.of(CheckpointTaken)  # the tool said it mutates: a snapshot came first
    assert checkpoint.tool == "stamp"


CREATE_NOTES = call("editor", command="create", path="/workspace/notes.md", file_text="one")
EDIT_NOTES = call("editor", command="str_replace", path="/workspace/notes.md", old_str="one", new_str="two")


def recording(trajectory: Path) -> tuple[EventBus, TrajectoryWriter]:
    """A bus whose events go to ``trajectory``, as a front end's do."""
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    return bus, writer


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_undo_after_a_resume_reaches_the_steps_before_it(kind: str, repo: Path, tmp_path: Path) -> None:
    bus, writer = recording(trajectory := tmp_path / "run" / "trajectory.jsonl")
    async with create_sandbox(kind, sandbox_spec(repo)) as first_box:
        backend = replay(tmp_path / "before.jsonl", CREATE_NOTES, FINISH, EDIT_NOTES, FINISH)
        agent = Agent(backend, first_box, bus, run_id="resumed")
        assert (await agent.run("Write notes.", "You are a test agent.")).submitted
        agent.budget = Budget()  # a fresh budget per request: the steps count on all the same
        assert agent.next_step == 3
        assert (await agent.continue_with("Now two.")).submitted
    writer.close()
    state = load_trajectory(trajectory)
    assert [(c.turn, c.tool) for c in state.checkpoints] == [(1, "editor:create"), (3, "editor:str_replace")]
    assert state.checkpoints[0].patch == "" and "+one" in state.checkpoints[1].patch

    async with create_sandbox(kind, sandbox_spec(repo)) as box:  # a fresh sandbox: no snapshot in it
        bus = EventBus()
        seen = Recorder(bus)
        again = Agent(replay(tmp_path / "after.jsonl", FINISH), box, bus, run_id="resumed")
        assert await again.resume(state, fresh_budget=True) == []
        assert (await box.read_file("/workspace/notes.md")) == b"two" and again.next_step == 5
        assert (await again.undo(3)) is not None  # a step of the first sandbox's
        assert (await box.read_file("/workspace/notes.md")) == b"one"
        assert seen.of(WorkspaceUndone)[0].undone == "step 3 editor:str_replace"
        assert (await again.undo(1)) is not None
        assert "notes.md" not in (await box.exec("ls /workspace")).output
        assert await box.diff() == ""
        assert (await again.continue_with("Leave it.")).submitted  # the conversation goes on


async def test_after_a_resume_a_snapshot_that_cannot_be_rebuilt_is_named(repo: Path, tmp_path: Path) -> None:
    """The working tree changed between the sessions, so a recorded diff does not apply to it any
    more: undo says which step it cannot reach and which it can."""
    bus, writer = recording(trajectory := tmp_path / "run" / "trajectory.jsonl")
    async with create_sandbox("local", sandbox_spec(repo)) as first_box:
        agent = Agent(
            replay(tmp_path / "a.jsonl", CREATE_NOTES, EDIT_NOTES, FINISH), first_box, bus, run_id="lost"
        )
        assert (await agent.run("Write notes.", "You are a test agent.")).submitted
        assert not agent.checkpoints.can_undo_to(3)  # nothing changed since step 3 began
    writer.close()
    state = load_trajectory(trajectory)
    (repo / "notes.md").write_text("mine\n")  # the person's own file of that name, not committed
    async with create_sandbox("local", sandbox_spec(repo)) as box:
        again = Agent(replay(tmp_path / "b.jsonl", FINISH), box, EventBus(), run_id="lost")
        with pytest.raises(WorkspaceCheckpointError, match="could not restore the workspace"):
            await again.resume(state, fresh_budget=True)  # the saved patch creates notes.md too
        # step 1's snapshot (before the create) holds no change: it is made again; step 2's is not
        assert [(c.turn, bool(c.commit)) for c in again.checkpoints.taken] == [(1, True), (2, False)]
        assert again.checkpoints.can_undo_to(1) and not again.checkpoints.can_undo_to(2)
        with pytest.raises(
            WorkspaceCheckpointError, match=r"step 2 could not be rebuilt .*; undo can go back to step 1"
        ):
            await again.undo(2)
        assert (await again.undo(1)) is not None
        assert (await box.read_file("/workspace/notes.md")) == b"mine\n"


def test_a_snapshot_taken_when_the_diff_was_unreadable_is_not_rebuilt(tmp_path: Path) -> None:
    """The trajectory knows what a snapshot held only while the recorded diff is the workspace's:
    after a change whose diff could not be read, the next snapshot's state is unknown until a diff
    is recorded again."""
    path = tmp_path / "trajectory.jsonl"
    writer = TrajectoryWriter(path)
    for event in (
        RunStarted(run_id="r", task="t", backend="replay"),
        CheckpointTaken(turn=1, ref="a", commit="1" * 40, tool="editor:create"),
        WorkspaceChanged(step=1, call_id="c1", patch="P1"),
        ErrorReported(kind="workspace", message="the workspace diff could not be read"),
        CheckpointTaken(turn=2, ref="b", commit="2" * 40, tool="shell"),
        WorkspaceChanged(step=3, call_id="c3", patch="P3"),
        CheckpointTaken(turn=4, ref="c", commit="3" * 40, tool="shell"),
    ):
        writer(event)
    writer.close()
    recorded = load_trajectory(path).checkpoints
    assert [(c.turn, c.patch) for c in recorded] == [(1, ""), (2, None), (4, "P3")]
