"""A command's output reaches the bus while it runs (``ToolOutput``, real local and Docker
sandboxes, replayed turns): pieces come before the call's result, in order, and an interrupted
command's result keeps what it printed until then, for the model and the trajectory."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from clover_agent.agent import Agent, TrajectoryWriter
from clover_agent.agent.notes import INTERRUPTED_TOOL
from clover_agent.agent.trajectory import read_events
from clover_agent.events import EventBus, ToolCallFinished, ToolCallStarted, ToolOutput
from clover_agent.sandboxes.base import Sandbox
from tests.clover_agent.test_agent_loop import FINISH, VIEW, call
from tests.clover_agent.test_agent_seams import DEADLINE_S, Recorder, conversation, replay, repo, sandbox

__all__ = ["repo", "sandbox"]  # the fixtures, shared with the seams' tests


async def _until(seen: Recorder, text: str) -> None:
    """Wait until the streamed pieces so far hold ``text``."""
    async with asyncio.timeout(DEADLINE_S):
        while text not in "".join(e.text for e in seen.of(ToolOutput)):
            seen._changed.clear()
            await seen._changed.wait()


async def test_a_command_streams_its_output_before_it_ends(sandbox: Sandbox, tmp_path: Path) -> None:
    gate = f"/tmp/gate-{uuid.uuid4().hex}"  # the test decides when the command goes on
    command = f"echo first-line; while [ ! -e {gate} ]; do sleep 0.05; done; echo second-line"
    backend = replay(tmp_path / "stream.jsonl", call("shell", command=command), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    bus.subscribe(writer)
    agent = Agent(backend, sandbox, bus, run_id="stream")
    run = asyncio.create_task(agent.run("Run it.", "You are a test agent."))
    started = await seen.first(ToolCallStarted, name="shell")
    await _until(seen, "first-line")
    assert not seen.of(ToolCallFinished)  # shown while the command still runs
    assert "second-line" not in "".join(e.text for e in seen.of(ToolOutput))
    await sandbox.exec(f"touch {gate}")
    finished = await seen.first(ToolCallFinished, name="shell")
    assert (await asyncio.wait_for(run, DEADLINE_S)).submitted
    await sandbox.exec(f"rm -f {gate}")
    pieces = seen.of(ToolOutput)
    assert {(p.step, p.call_id, p.name) for p in pieces} == {(started.step, started.call_id, "shell")}
    last_piece = max(seen.events.index(p) for p in pieces)
    assert seen.events.index(started) < seen.events.index(pieces[0])
    assert last_piece < seen.events.index(finished)  # every piece before the result
    assert "".join(p.text for p in pieces) == "first-line\nsecond-line\n"
    assert "first-line\nsecond-line" in finished.output and not finished.is_error
    writer.close()
    kept = read_events(tmp_path / "trajectory.jsonl")
    assert not any(isinstance(e, ToolOutput) for e in kept)  # the result holds them: not kept twice
    assert any(isinstance(e, ToolCallFinished) and e.call_id == finished.call_id for e in kept)


async def test_an_interrupted_command_keeps_its_partial_output(sandbox: Sandbox, tmp_path: Path) -> None:
    sleep = f"sleep 600.{uuid.uuid4().int % 10**6:06d}"  # its own: a local sandbox sees the host's processes
    command = f"for i in 1 2 3; do echo partial-$i; done; {sleep}; echo never-printed"
    backend = replay(tmp_path / "cut.jsonl", call("shell", command=command), VIEW, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="cut")
    run = asyncio.create_task(agent.run("Run it.", "You are a test agent."))
    await _until(seen, "partial-3")
    assert agent.interrupt()
    finished = await seen.first(ToolCallFinished, name="shell")
    assert finished.is_error
    assert finished.output.startswith(INTERRUPTED_TOOL)
    assert "partial-1\npartial-2\npartial-3" in finished.output and "never-printed" not in finished.output
    assert finished.full_output == "partial-1\npartial-2\npartial-3\n"
    assert (finished.data or {}).get("partial_output") is True
    # the process group is killed; under load its last process may take a moment to be reaped
    async with asyncio.timeout(DEADLINE_S):
        while sleep in (await sandbox.exec("ps -eo args")).output:
            await asyncio.sleep(0.1)
    agent.send("Never mind; look at the file.")
    assert (await asyncio.wait_for(run, DEADLINE_S)).submitted
    assert ("tool", finished.output) in conversation(agent)  # what the model read
    index = seen.events.index(finished)
    assert not any(isinstance(e, ToolOutput) for e in seen.events[index:])  # none after the result


async def test_an_interrupted_command_that_printed_nothing_says_only_that(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    marker = f"/tmp/started-{uuid.uuid4().hex}"
    command = f"touch {marker}; sleep 600.4"
    backend = replay(tmp_path / "quiet.jsonl", call("shell", command=command), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="quiet")
    run = asyncio.create_task(agent.run("Run it.", "You are a test agent."))
    await seen.first(ToolCallStarted, name="shell")
    async with asyncio.timeout(DEADLINE_S):
        while (await sandbox.exec(f"test -e {marker}")).exit_code != 0:
            await asyncio.sleep(0.1)
    assert agent.interrupt()
    finished = await seen.first(ToolCallFinished, name="shell")
    assert finished.output == INTERRUPTED_TOOL and not seen.of(ToolOutput)
    await sandbox.exec(f"rm -f {marker}")
    agent.send("Stop.")
    assert (await asyncio.wait_for(run, DEADLINE_S)).submitted


async def test_run_tests_streams_the_test_run(sandbox: Sandbox, tmp_path: Path) -> None:
    await sandbox.write_file(
        "/workspace/test_greet.py",
        b"from greet import greet\n\ndef test_greet():\n    assert greet('x') == 'hello x'\n",
    )
    backend = replay(tmp_path / "tests.jsonl", call("run_tests", target="test_greet.py"), FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(backend, sandbox, bus, run_id="tests")
    assert (await agent.run("Test it.", "You are a test agent.")).submitted
    finished = seen.of(ToolCallFinished)[0]
    pieces = [e for e in seen.of(ToolOutput) if e.call_id == finished.call_id]
    assert not finished.is_error, finished.output
    assert pieces and all(seen.events.index(p) < seen.events.index(finished) for p in pieces)
    assert "test_greet.py" in "".join(p.text for p in pieces)
