"""Malformed input to ``clover-agent acp``, written as raw bytes to its stdin: a line that is not
JSON, JSON that is not a JSON-RPC message and an unknown method each get a JSON-RPC error, the
agent keeps answering, stdout carries only protocol lines, and a sandbox that cannot start is an
error at ``session/new`` that names it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.acp.helpers import ROOT, agent_args
from tests.git_repos import git
from tests.tui.helpers import calculator_repo, call, turn, write_replay


class RawAgent:
    """The agent as a subprocess, spoken to in bytes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[bytes] = []

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def read(self) -> dict:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 120)
        self.lines.append(line)
        return json.loads(line)

    async def request(self, request_id: int, method: str, params: dict) -> dict:
        await self.write(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()
            + b"\n"
        )
        return await self.read()

    async def close(self) -> bytes:
        assert self.process.stdin is not None
        self.process.stdin.close()
        rest = await asyncio.wait_for(self.process.stdout.read(), 120)  # type: ignore[union-attr]
        await asyncio.wait_for(self.process.wait(), 120)
        return rest


async def _start(args: list[str], log: Path, **env: str) -> RawAgent:
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=stderr, cwd=ROOT, env={**os.environ, **env},
        )  # fmt: skip
    return RawAgent(process)


async def test_malformed_messages_get_protocol_errors_and_the_agent_goes_on(tmp_path: Path) -> None:
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="x"))])
    agent = await _start(agent_args(replay), tmp_path / "agent.log")
    await agent.write(b"{this is not json\n")
    error = await agent.read()
    assert error["id"] is None and error["error"]["code"] == -32700

    await agent.write(b"[1, 2, 3]\n")
    assert (await agent.read())["error"]["code"] == -32600
    await agent.write(b'{"jsonrpc": "2.0", "id": 4}\n')
    invalid = await agent.read()
    assert invalid["id"] == 4 and invalid["error"]["code"] == -32600
    await agent.write(b'{"id": 5, "method": "initialize", "params": {}}\n')  # no "jsonrpc": "2.0"
    assert (await agent.read())["error"]["code"] == -32600

    unknown = await agent.request(6, "no/such_method", {})
    assert unknown["id"] == 6 and unknown["error"]["code"] == -32601
    bad_params = await agent.request(7, "session/new", {"mcpServers": []})  # no cwd
    assert bad_params["id"] == 7 and bad_params["error"]["code"] == -32602
    no_session = await agent.request(8, "session/prompt", {"sessionId": "nope", "prompt": []})
    assert no_session["id"] == 8 and no_session["error"]["code"] == -32602

    init = await agent.request(9, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert init["id"] == 9 and init["result"]["protocolVersion"] == 1
    assert await agent.close() == b""
    assert agent.process.returncode == 0
    assert all(line.endswith(b"\n") and json.loads(line)["jsonrpc"] == "2.0" for line in agent.lines)


async def test_a_docker_sandbox_that_cannot_start_is_an_error_at_session_new(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="x"))])
    nowhere = f"unix://{tmp_path}/no-docker.sock"
    agent = await _start(agent_args(replay, "docker"), tmp_path / "agent.log", DOCKER_HOST=nowhere)
    await agent.request(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    answer = await agent.request(2, "session/new", {"cwd": str(repo), "mcpServers": []})
    assert answer["error"]["code"] == -32001
    assert "Docker" in answer["error"]["message"], answer
    assert await agent.close() == b""


async def test_what_the_agent_says_besides_the_protocol_goes_to_stderr(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nsetup = ["echo set up"]\n', encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="x"))])
    log = tmp_path / "agent.log"
    agent = await _start(agent_args(replay), log)
    await agent.request(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    opened = await agent.request(2, "session/new", {"cwd": str(repo), "mcpServers": []})
    assert "sessionId" in opened["result"]
    # after the answer (the client knows the session by then): its commands and its mode
    updates = [(await agent.read())["params"]["update"]["sessionUpdate"] for _ in range(2)]
    assert updates == ["available_commands_update", "current_mode_update"]
    assert await agent.close() == b""
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in agent.lines)
    said = log.read_text(encoding="utf-8")
    assert "setup ignored: you have not trusted this file" in said  # the untrusted config's note
