"""Hooks through ACP: ``python -m clover_agent acp`` driven by the SDK's client, with the user's
settings holding a Claude Code-style denylist and a PreHandBack veto."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp import schema

from tests.acp.helpers import RecordingClient, agent_args, check_conformance, prompt, running_agent
from tests.git_repos import git
from tests.hooks.scripts import CLAUDE_DENYLIST, script
from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

pytestmark = pytest.mark.slow


def _texts(update: schema.ToolCallProgress | schema.ToolCallStart) -> str:
    return "".join(
        c.content.text for c in update.content or [] if isinstance(c, schema.ContentToolCallContent)
    )


async def test_a_hooks_deny_shows_in_the_session_and_its_veto_keeps_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = calculator_repo(tmp_path)
    denylist = script(tmp_path / "hooks", "deny-rm.sh", CLAUDE_DENYLIST)
    veto = script(tmp_path / "hooks", "veto.sh", "cat >/dev/null\necho 'release freeze' >&2\nexit 2\n")
    settings = tmp_path / "config.toml"
    settings.write_text(
        f'[[hooks.PreToolUse]]\nmatcher = "Bash"\ncommand = "{denylist}"\n\n'
        f'[[hooks.PreHandBack]]\ncommand = "{veto}"\n'
    )
    monkeypatch.setenv("CLOVER_CONFIG", str(settings))
    rm = call("shell", command="rm -rf /workspace/tests")
    replay = write_replay(
        tmp_path / "fix.jsonl", [turn("", rm), turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["apply"])
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "end_turn"
    shell = next(u for u in client.of(schema.ToolCallStart) if u.title and "rm -rf" in u.title)
    ended = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id == shell.tool_call_id][-1]
    assert ended.status == "failed" and "rm -rf is not allowed here" in _texts(ended)
    assert "[hook: PreToolUse hook" in client.text()
    handback = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id.startswith("handback")][-1]
    assert handback.status == "failed" and "release freeze" in _texts(handback)
    assert not client.written and git(repo, "status", "--porcelain").strip() == ""
    check_conformance(agent.messages)
