"""A real third-party MCP server from the package index (``mcp-server-time``, pinned) in a TUI
session under Docker: placed in the sandbox, where it is not installed, it fails with one line that
says why and how to run it instead (never a traceback on the screen); placed on this machine with
``where = "host"`` it runs, ``/mcp`` lists both (the reason, the tools), and the model calls it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Done, ToolCallFinished
from clover_agent.session.assembly import SessionConfig
from clover_agent.tools.mcp import McpServerConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.widgets.notice import NoticeLine
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, call, send, session_key, turn, wait_for, write_replay

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.index]

#: The server and what it needs beyond what clover-agent has (mcp, pydantic), pinned.
PINNED = ("mcp-server-time==2026.10.19", "tzlocal==5.3.1", "tzdata==2025.2")


def _installed(tmp_path: Path) -> Path:
    target = tmp_path / "time-server"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *PINNED],
        check=True,
        timeout=300,
    )
    return target


async def test_a_third_party_server_that_cannot_start_says_why_and_on_the_host_it_runs(
    tmp_path: Path, capfd
) -> None:
    target = _installed(tmp_path)
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "time.jsonl",
        [turn("", call("mcp__time__get_current_time", timezone="UTC")), turn("It is now noted.")],
    )
    options = SessionConfig(
        repo=repo,
        make_backend=lambda: ReplayBackend(replay),
        spec=sandbox_spec(repo),
        sandbox_kind="docker",
        record_key=session_key(repo),
        mcp_servers=(
            McpServerConfig("sandboxed", "python3", ("-m", "mcp_server_time")),  # the default placement
            McpServerConfig(
                "time",
                sys.executable,
                ("-m", "mcp_server_time"),
                env={"PYTHONPATH": str(target)},
                where="host",
                approve="allow",
            ),
        ),
    )
    app = CloverApp(options)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.session.mcp is not None, "the MCP servers", deadline_s=300)
        await send(pilot, "/mcp")
        await wait_for(pilot, lambda: any("MCP `time`" in n.text for n in app.query(NoticeLine)), "/mcp")
        shown = [n.text for n in app.query(NoticeLine)]
        failed = next(t for t in shown if "did not start" in t)
        assert "`sandboxed`" in failed and "No module named mcp_server_time" in failed
        assert 'where = "host"' in failed and "[mcp_servers.sandboxed]" in failed
        listed = [t for t in shown if t.lstrip("•!✓✗ ").startswith("MCP `")]
        assert any("MCP `sandboxed`" in t and "failed" in t and "No module named" in t for t in listed), (
            listed
        )
        assert any("MCP `time`" in t and "running" in t and "get_current_time" in t for t in listed), listed

        await send(pilot, "what time is it in UTC?")
        await wait_for(
            pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request", deadline_s=120
        )
    (answer,) = [
        e for e in app.events if isinstance(e, ToolCallFinished) and e.name == "mcp__time__get_current_time"
    ]
    assert not answer.is_error and "UTC" in answer.output
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out and "pydantic" not in captured.err
