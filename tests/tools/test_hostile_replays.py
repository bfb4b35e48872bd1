"""Replayed hostile agents against the real tools and sandboxes (local and Docker): a FIFO, NUL
bytes, a 300 MB file, option-shaped run_tests targets under the read-only policy, and a command
that fills the disk. Each run ends normally (the agent reads a tool error and finishes), the
sandbox never counts as lost, and nothing outside what the agent may touch changes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from clover_agent.agent import Agent, TrajectoryWriter
from clover_agent.agent.policy import preset
from clover_agent.agent.trajectory import read_events
from clover_agent.backends.replay import ReplayBackend
from clover_agent.errors import ExitCode
from clover_agent.events import Done, EventBus, ToolCallFinished
from clover_agent.sandboxes.base import SandboxLimits, SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec
from tests.sandboxes.conftest import tree_snapshot

KINDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]
FINISH = call("finish", summary="done")


async def replay(
    kind: str, repo: Path, tmp_path: Path, turns: list[str], *, spec: SandboxSpec | None = None, **options
):
    """Run ``turns`` to the end; returns (result, finished tool calls, the workspace's victim.py at
    the end). The user's tree is checked to be untouched."""
    before = tree_snapshot(repo)
    trajectory = tmp_path / f"run-{time.monotonic_ns()}" / "trajectory.jsonl"
    bus = EventBus()
    writer = TrajectoryWriter(trajectory)
    bus.subscribe(writer)
    backend = ReplayBackend(write_replay(tmp_path / f"replay-{time.monotonic_ns()}.jsonl", [*turns, FINISH]))
    async with create_sandbox(kind, spec or sandbox_spec(repo)) as sandbox:
        agent = Agent(backend, sandbox, bus, run_id="hostile", **options)
        result = await asyncio.wait_for(agent.run("Do the task.", "You are a test agent."), 600)
        victim = await sandbox.read_file("/workspace/victim.py")
    writer.close()
    events = read_events(trajectory)
    assert isinstance(events[-1], Done) and events[-1].exit_code == result.exit_code
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert result.submitted and result.exit_code == ExitCode.OK, result.message
    assert tree_snapshot(repo) == before
    return result, finished, victim


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {
            "victim.py": "precious = True\n",
            "tests/test_t.py": "def test_ok():\n    assert True\n",
            # Out of the patch: the workspace diff of a 380 MB file is another matter (see the note).
            ".gitignore": "*.log\n",
        },
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_fifo_nul_bytes_and_a_huge_file(kind: str, repo: Path, tmp_path: Path) -> None:
    turns = [
        call("shell", command="mkfifo /workspace/pipe && ln -s pipe /workspace/to_pipe"),
        call("editor", command="view", path="/workspace/pipe"),
        call("editor", command="view", path="/workspace/to_pipe"),
        call("search", pattern="x", path="/workspace/pipe"),
        call("shell", command="echo one\0two"),
        call("editor", command="create", path="/workspace/nul.txt", file_text="a\0b"),
        call("shell", command="seq 1 40000000 > /workspace/huge.log && rm -f pipe to_pipe"),
        call("editor", command="view", path="/workspace/huge.log"),
        call("editor", command="view", path="/workspace/huge.log", view_range="[123456, 123457]"),
        call("shell", command="rm /workspace/huge.log"),
    ]
    _, finished, victim = await replay(kind, repo, tmp_path, turns)
    outputs = [f.output for f in finished]
    assert "is a FIFO (named pipe), not a regular file" in outputs[1]
    assert "is a FIFO (named pipe), not a regular file" in outputs[2]
    assert "FIFO (named pipe)" in outputs[3]
    assert "`command` contains a NUL byte" in outputs[4]
    assert "`file_text` contains a NUL byte" in outputs[5]
    assert "over the 10,000,000-byte limit for the editor" in outputs[7]
    assert outputs[8].splitlines()[1:] == ["123456\t123456", "123457\t123457"]
    assert all("sandbox stopped working" not in o for o in outputs)
    assert victim == b"precious = True\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_option_shaped_targets_under_the_read_only_policy(
    kind: str, repo: Path, tmp_path: Path
) -> None:
    turns = [
        call("run_tests", target="--junitxml=/workspace/victim.py"),
        call("run_tests", target="tests/test_t.py --junitxml=/workspace/victim.py"),
        call("run_tests", target="-o cache_dir=/workspace/x -p no:terminal"),
        call("run_tests", target="tests/test_t.py"),
    ]
    _, finished, victim = await replay(kind, repo, tmp_path, turns, policy=preset("read-only"))
    outputs = [f.output for f in finished]
    for refused in outputs[:3]:
        assert "looks like a command-line option, which run_tests never passes on" in refused
    assert "pytest: 1 passed" in outputs[3]
    assert victim == b"precious = True\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_that_fills_the_disk(kind: str, repo: Path, tmp_path: Path) -> None:
    """The command is told, in words, that it ran out of space and how full the disk is. (It frees
    the space itself: a workspace left full also stops the loop's own diff, which writes git
    objects into it; see the report.)"""
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=64 * 1024 * 1024))
    turns = [
        call("shell", command="fallocate -l 3G /workspace/fill.bin; ls /workspace"),
        call("shell", command="head -c 200M /dev/zero > /workspace/fill.bin; rm -f /workspace/fill.bin"),
        call("editor", command="create", path="/workspace/after.txt", file_text="fits\n"),
    ]
    result, finished, victim = await replay(kind, repo, tmp_path, turns, spec=spec)
    outputs = [f.output for f in finished]
    assert "[Out of space: /workspace has " in outputs[0] and "[Out of space: /workspace has " in outputs[1]
    if kind == "docker":
        assert "No space left on device" in outputs[0] and "of 64.0 MiB used" in outputs[1]
    else:  # local: each file is capped at the limit
        assert "each file may be at most 64.0 MiB" in outputs[1]
    assert outputs[2] == "File created successfully at: /workspace/after.txt"
    assert "after.txt" in result.patch and "fill.bin" not in result.patch
    assert victim == b"precious = True\n"
