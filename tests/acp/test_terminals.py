"""Shell calls shown in the client's terminals (a client advertising ``terminal``), the command
running in the sandbox all the same: its output streamed into a terminal the client runs (a
follower of ours, never the model's command), made inert, the terminal embedded in the tool call
and released at the end with the command's exit code; the model's result as without a terminal;
on cancel, the command gone in the sandbox and the terminal killed and released."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from acp import schema

from clover_agent.events import MessageAdded
from clover_agent.session.store import load_session
from tests.acp.helpers import (
    RecordingClient,
    agent_args,
    check_conformance,
    prompt,
    running_agent,
    wait_until,
)
from tests.tui.helpers import calculator_repo, call, session_key, turn, write_replay

SANDBOXES = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def _progress(client: RecordingClient, call_id: str) -> list[schema.ToolCallProgress]:
    return [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id == call_id]


def _shell(client: RecordingClient) -> schema.ToolCallStart:
    return next(u for u in client.of(schema.ToolCallStart) if u.kind == "execute")


@pytest.mark.slow
async def test_a_command_streams_into_the_clients_terminal(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "gate"
    command = (
        "echo acp-first-line; printf 'x\\033]52;c;aGk=\\007y\\n'; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo acp-second-line; exit 3"
    )
    replay = write_replay(
        tmp_path / "term.jsonl",
        [turn("", call("shell", command=command)), turn("", call("finish", summary="Ran."))],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client, terminal=True) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "run it"))
        await wait_until(
            lambda: any(b"acp-first-line" in t.output for t in client.terminals.values()),
            "the terminal's output",
        )
        (terminal,) = client.terminals.values()
        # what the client runs is our follower, on this machine; the model's command is not in it
        assert terminal.argv[0] == sys.executable and not any("acp-first-line" in a for a in terminal.argv)
        run = _shell(client)
        embedded = [
            c for u in _progress(client, run.tool_call_id) for c in u.content or [] if c.type == "terminal"
        ]
        assert embedded and embedded[0].terminal_id == terminal.terminal_id
        assert terminal.process.returncode is None and not terminal.released  # the command still runs
        gate.touch()
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "end_turn"

    assert terminal.released and terminal.process.returncode == 3  # the command's exit code
    shown = terminal.output.decode()
    assert "acp-first-line\n" in shown and "acp-second-line\n" in shown
    assert "x\\x1b]52;c;aGk=\\x07y" in shown and b"\x1b" not in terminal.output  # shown, not obeyed
    last = _progress(client, run.tool_call_id)[-1]
    assert last.status == "failed" and [c.type for c in last.content or []] == ["terminal"]
    assert last.raw_output is not None
    result = last.raw_output["output"]  # what the model read: the shell tool's result, as ever
    assert "acp-first-line" in result and "acp-second-line" in result and "[exit code: 3]" in result
    check_conformance(agent.messages)


def _sleepers(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_cancel_stops_the_command_in_the_sandbox_and_releases_its_terminal(
    tmp_path: Path, sandbox: str
) -> None:
    repo = calculator_repo(tmp_path)
    marker = "411.75"
    replay = write_replay(
        tmp_path / "slow.jsonl",
        [
            turn("", call("shell", command=f"echo waiting; sleep {marker}")),
            turn("", call("shell", command=f"ps -eo args | grep -v grep | grep -c 'sleep {marker}' || true")),
            turn("", call("finish", summary="Stopped.")),
        ],
    )
    client = RecordingClient()
    async with running_agent(
        agent_args(replay, sandbox), tmp_path / "agent.log", client, terminal=True
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "wait"))
        await wait_until(
            lambda: any(b"waiting" in t.output for t in client.terminals.values()), "the terminal"
        )
        if sandbox == "local":
            await wait_until(lambda: _sleepers(f"sleep {marker}"), "the sleep process")
        await agent.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "cancelled"
        (terminal,) = client.terminals.values()
        await wait_until(lambda: terminal.released, "the terminal's release")
        assert terminal.killed and terminal.process.returncode is not None
        if sandbox == "local":
            assert not _sleepers(f"sleep {marker}")
        # the next prompt goes on; inside the sandbox no sleep is left
        assert (await prompt(agent, session.session_id, "never mind")).stop_reason == "end_turn"
        count = next(u for u in client.of(schema.ToolCallStart) if u.title and "grep -c" in u.title)
        assert "0" in (_progress(client, count.tool_call_id)[-1].raw_output or {}).get("output", "").split()
    check_conformance(agent.messages)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_terminal_stopped_in_the_editor_stops_the_command_and_the_agent_goes_on(
    tmp_path: Path, sandbox: str
) -> None:
    repo = calculator_repo(tmp_path)
    marker = "523.5"
    replay = write_replay(
        tmp_path / "stop.jsonl",
        [
            turn("", call("shell", command=f"echo waiting; sleep {marker}")),
            turn("", call("shell", command=f"ps -eo args | grep -v grep | grep -c 'sleep {marker}' || true")),
            turn("", call("finish", summary="It was stopped.")),
        ],
    )
    client = RecordingClient()
    args = agent_args(replay, sandbox)
    async with running_agent(args, tmp_path / "agent.log", client, terminal=True) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "wait"))
        await wait_until(
            lambda: any(b"waiting" in t.output for t in client.terminals.values()), "the terminal"
        )
        if sandbox == "local":
            await wait_until(lambda: _sleepers(f"sleep {marker}"), "the sleep process")
        (terminal,) = client.terminals.values()
        terminal.process.kill()  # the person's stop button on the editor's terminal
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "end_turn"  # the agent went on
        if sandbox == "local":
            assert not _sleepers(f"sleep {marker}")
    sleep, count = [u for u in client.of(schema.ToolCallStart) if u.kind == "execute"]
    assert _progress(client, sleep.tool_call_id)[-1].status == "failed"
    assert "0" in (_progress(client, count.tool_call_id)[-1].raw_output or {}).get("output", "").split()
    assert "It was stopped." in client.text()
    saved = load_session(repo, session.session_id, session_key(repo))
    told = [
        e.message["content"]
        for e in saved.events
        if isinstance(e, MessageAdded) and e.message["role"] == "user"
    ]
    assert any("stopped that command in my editor's terminal" in str(m) for m in told)


@pytest.mark.slow
async def test_a_huge_output_stays_bounded_in_the_terminal_and_the_model_reads_its_end(
    tmp_path: Path,
) -> None:
    repo = calculator_repo(tmp_path)
    command = "head -c 6000000 /dev/zero | tr '\\0' a; echo; echo the-end-marker"
    replay = write_replay(
        tmp_path / "huge.jsonl",
        [turn("", call("shell", command=command)), turn("", call("finish", summary="Ran."))],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client, terminal=True) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "print a lot")).stop_reason == "end_turn"
    (terminal,) = client.terminals.values()
    assert terminal.released and terminal.process.returncode == 0
    assert terminal.output.count(b"a") <= 4 * 1024 * 1024 + 10
    assert terminal.output.rstrip().endswith(b"the-end-marker")
    result = (_progress(client, _shell(client).tool_call_id)[-1].raw_output or {})["output"]
    assert "the-end-marker" in result and len(result) < 100_000  # the shell tool's own head and tail


@pytest.mark.slow
async def test_without_the_terminal_capability_the_output_is_text(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "plain.jsonl",
        [turn("", call("shell", command="echo plain-output")), turn("", call("finish", summary="Ran."))],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "run it")).stop_reason == "end_turn"
    assert not client.terminals
    last = _progress(client, _shell(client).tool_call_id)[-1]
    assert [c.type for c in last.content or []] == ["content"] and "plain-output" in last.content[
        0
    ].content.text
