"""MCP servers an ACP client passes in session/new are used: the editor's stdio server (a program
on this machine) offers its tools to the session, a call is asked about through
session/request_permission and answered; a server that cannot start is told with the next answer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from acp import schema

from tests.acp.helpers import RecordingClient, agent_args, check_conformance, prompt, running_agent
from tests.mcp.test_mcp_tools import SERVER
from tests.tui.helpers import calculator_repo, call, turn, write_replay

pytestmark = pytest.mark.slow


async def test_a_clients_stdio_server_is_used_through_the_approvals(tmp_path: Path) -> None:
    server = tmp_path / "calc_server.py"
    server.write_text(SERVER)
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "mcp.jsonl",
        [
            turn("", call("mcp__calc__add", a=2, b=3)),
            turn("Two and three make five.", call("finish", summary="5")),
        ],
    )
    client = RecordingClient(answers=["allow_once"])
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(
            cwd=str(repo),
            mcp_servers=[
                schema.McpServerStdio(name="calc", command=sys.executable, args=[str(server)], env=[]),
                schema.McpServerStdio(name="gone", command="/nonexistent/server", args=[], env=[]),
            ],
        )
        answered = await prompt(agent, session.session_id, "what is 2 + 3?")
        assert answered.stop_reason == "end_turn"
    (asked,) = client.permissions  # the MCP call; nothing changed, so no hand-back is offered
    assert asked.tool_call.title is not None and "mcp__calc__add" in asked.tool_call.title
    results = [
        c.content.text
        for u in client.of(schema.ToolCallProgress)
        for c in u.content or []
        if isinstance(c, schema.ContentToolCallContent) and u.status == "completed"
    ]
    assert "5" in results, results
    said = client.text()
    assert "Note: MCP server `gone`" in said and "did not start" in said, said
    assert "Two and three make five." in said
    check_conformance(agent.messages)
