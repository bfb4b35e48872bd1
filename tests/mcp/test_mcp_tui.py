"""The TUI's session offers the tools of the MCP servers it is given (``tui`` passes those of the
settings and of a trusted repository): a call answered by a server written here, in the local
sandbox's copy, and a server that cannot start named in a notice, the session going on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, ToolCallFinished
from clover_agent.session.assembly import SessionConfig
from clover_agent.tools.mcp import McpServerConfig
from clover_agent.tui.app import CloverApp
from tests.mcp.test_mcp_tools import SERVER
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, call, send, session_key, turn, wait_for, write_replay

pytestmark = pytest.mark.slow


async def test_a_tui_session_calls_a_servers_tool(tmp_path: Path) -> None:
    server = tmp_path / "calc_server.py"
    server.write_text(SERVER)
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "mcp.jsonl",
        [turn("", call("mcp__calc__add", a=4, b=5)), turn("", call("finish", summary="9"))],
    )
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        spec=sandbox_spec(repo),
        sandbox_kind="local",
        record_key=session_key(repo),
        mcp_servers=(
            McpServerConfig("calc", sys.executable, (str(server),), approve="allow"),
            McpServerConfig("gone", "/nonexistent/server"),
        ),
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "what is 4 + 5?")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
    (answer,) = [e for e in app.events if isinstance(e, ToolCallFinished) and e.name == "mcp__calc__add"]
    assert answer.output == "9" and not answer.is_error
    notices = [getattr(e, "text", "") for e in app.events if type(e).__name__ == "Notice"]
    assert any("MCP server `gone`" in text and "did not start" in text for text in notices), notices
