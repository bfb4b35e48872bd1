"""What editors expect of an ACP agent beyond the basics, driven by the SDK's client: session modes
listed and switched (and what the agent may do changing with them), one question per edit (the
edit's permission showing the diff it would make; its hand-back not asked again), the texts of
separate steps kept apart, slash commands listed and run, ``session/list``, and ``session/load``
of a session whose changes were applied."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp import RequestError, schema

from tests.acp.helpers import RecordingClient, agent_args, check_conformance, prompt, running_agent
from tests.git_repos import git
from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

FIXED = '    """Return the sum of a and b."""\n    return a + b'


def _handbacks(client: RecordingClient) -> list[schema.RequestPermissionRequest]:
    return [p for p in client.permissions if p.tool_call.tool_call_id.startswith("handback")]


def _last_of(client: RecordingClient, call_id: str) -> schema.ToolCallProgress:
    return [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id == call_id][-1]


def _texts(update: schema.ToolCallProgress | schema.ToolCallStart) -> str:
    return "".join(c.content.text for c in update.content or [] if c.type == "content")


@pytest.mark.slow
async def test_modes_are_listed_and_switching_changes_what_is_asked(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    create = call("editor", command="create", path="/workspace/notes.txt", file_text="a note\n")
    replay = write_replay(
        tmp_path / "modes.jsonl",
        [
            turn("Reading.", call("editor", command="view", path="/workspace/calculator.py")),
            turn("Fixing `add`.", FIX_ADD),
            turn("", call("finish", summary="Fixed add.")),
            turn("Writing a note.", create),
            turn("", call("finish", summary="Noted.")),
        ],
    )
    client = RecordingClient(answers=["allow_once", "keep"])
    args = agent_args(replay, "local", "--policy", "ask")
    async with running_agent(args, tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert session.modes is not None and session.modes.current_mode_id == "ask"
        assert [m.id for m in session.modes.available_modes] == ["ask", "auto", "plan"]

        # under ask: the edit is asked about once, its request carrying the diff it would make ...
        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "end_turn"
        (edit,) = client.permissions
        assert edit.tool_call.kind == "edit"
        (diff,) = [c for c in edit.tool_call.content or [] if c.type == "diff"]
        assert diff.path == str(repo / "calculator.py") and "return a - b" in (diff.old_text or "")
        assert FIXED in diff.new_text
        said = [c.content.text for c in edit.tool_call.content or [] if c.type == "content"]
        assert said[-1].startswith("Reject always: refuses every `editor:str_replace` call without asking")
        # ... and the hand-back of exactly that change is applied without a second question
        (offer,) = [u for u in client.of(schema.ToolCallStart) if u.tool_call_id.startswith("handback")]
        applied = _last_of(client, offer.tool_call_id)
        assert applied.status == "completed" and "You approved each change" in _texts(applied)
        assert FIXED in (repo / "calculator.py").read_text(encoding="utf-8")
        # the texts of separate steps do not run together
        assert "Reading.\n\nFixing `add`.\n\nFixed add." in client.text()

        # switched to auto: the next edit is not asked about; its hand-back is (nothing approved it)
        assert await agent.conn.set_session_mode(session_id=session.session_id, mode_id="auto") is not None
        modes = [u.current_mode_id for u in client.of(schema.CurrentModeUpdate)]
        assert modes[-1] == "auto"
        assert (await prompt(agent, session.session_id, "write a note")).stop_reason == "end_turn"
        assert [p.tool_call.tool_call_id.startswith("handback") for p in client.permissions] == [False, True]
        assert not (repo / "notes.txt").exists()  # kept in the sandbox

        with pytest.raises(RequestError) as unknown:
            await agent.conn.set_session_mode(session_id=session.session_id, mode_id="yolo")
        assert "the modes are ask, auto, plan" in str(unknown.value.data)
    check_conformance(agent.messages)


@pytest.mark.slow
async def test_a_mode_set_while_a_prompt_runs_holds_from_the_next_call(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "switch.jsonl",
        [
            turn("", call("shell", command="echo first-call")),
            turn("", call("shell", command="echo second-call")),
            turn("", call("finish", summary="Both ran.")),
        ],
    )
    client = RecordingClient(answers=["allow_once"])
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])

        async def switch() -> None:  # the person picks auto while the first call waits for them
            await agent.conn.set_session_mode(session_id=session.session_id, mode_id="auto")

        client.before_answer = switch
        assert (await prompt(agent, session.session_id, "run both")).stop_reason == "end_turn"
    (asked,) = client.permissions
    assert asked.tool_call.raw_input == {"command": "echo first-call"}
    runs = [u for u in client.of(schema.ToolCallStart) if u.kind == "execute"]
    assert [_last_of(client, u.tool_call_id).status for u in runs] == ["completed", "completed"]
    assert [u.current_mode_id for u in client.of(schema.CurrentModeUpdate)] == ["ask", "auto"]


@pytest.mark.slow
async def test_an_edit_answered_always_still_gets_its_hand_back_asked(tmp_path: Path) -> None:
    """Only what the person saw and allowed one by one skips the hand-back's question: an edit
    allowed by an earlier "always", or a file a command changed, is asked about at the end."""
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "always.jsonl",
        [
            turn("", FIX_ADD),
            turn("", call("shell", command="echo more >> /workspace/calculator.py")),
            turn("", call("finish", summary="Fixed add.")),
        ],
    )
    client = RecordingClient(answers=["allow_once", "allow_once", "keep"])
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add")
    assert len(_handbacks(client)) == 1  # the command changed the file after the approved edit
    assert git(repo, "status", "--porcelain").strip() == ""


@pytest.mark.slow
async def test_slash_commands_are_listed_and_run(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "commands.jsonl",
        [turn("", FIX_ADD), turn("", call("finish", summary="Fixed.")), turn("I do not know /frobnicate.")],
    )
    client = RecordingClient(answers=["keep", "keep"])
    async with running_agent(agent_args(replay, "local"), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add")
        (listed,) = client.of(schema.AvailableCommandsUpdate)
        names = [c.name for c in listed.available_commands]
        assert names == ["undo", "tests", "diff", "apply", "usage", "mcp"]

        async def said(text: str) -> str:
            before = len(client.updates)
            assert (await prompt(agent, session.session_id, text)).stop_reason == "end_turn"
            return "".join(
                u.content.text for u in client.updates[before:] if isinstance(u, schema.AgentMessageChunk)
            )

        diff = await said("/diff")
        assert diff.startswith("```diff\n") and "+    return a + b" in diff
        tests = await said("/tests")
        assert "| passed | failed |" in tests and "Failing:" not in tests
        usage = await said("/usage")
        assert "| last request | 2 |" in usage and "| this session | 2 |" in usage
        assert "No MCP servers" in await said("/mcp")
        assert await said("/apply") == ""  # offered as the hand-back's permission request
        assert len(_handbacks(client)) == 2
        undo = await said("/undo")
        assert undo.startswith("Undid request 1 in the sandbox: `calculator.py`"), undo
        assert "Failing:\n- `tests/test_calculator.py::test_add`" in await said("/tests")
        assert "No changes" in await said("/diff")
        assert "Nothing to apply" in await said("/apply")
        assert "Nothing to undo" in await said("/undo")
        # not a command: the model reads it
        assert await said("/frobnicate the widget") == "I do not know /frobnicate."
    assert git(repo, "status", "--porcelain").strip() == ""
    check_conformance(agent.messages)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_session_whose_changes_were_applied_loads_and_is_listed(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    first = write_replay(
        tmp_path / "first.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    async with running_agent(
        agent_args(first, sandbox), tmp_path / "agent.log", RecordingClient(answers=["apply"])
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add please")
        assert agent.init is not None and agent.init.agent_capabilities is not None
        capabilities = agent.init.agent_capabilities.session_capabilities
        assert capabilities is not None and capabilities.list is not None
        listed = await agent.conn.list_sessions(cwd=str(repo))
        assert [(s.session_id, s.title, s.cwd) for s in listed.sessions] == [
            (session.session_id, "fix add please", str(repo))
        ]
    tree = (repo / "calculator.py").read_text(encoding="utf-8")
    assert FIXED in tree

    later = write_replay(
        tmp_path / "later.jsonl",
        [
            turn("", call("shell", command="grep -c 'a + b' /workspace/calculator.py")),
            turn("", call("finish", summary="Still fixed.")),
        ],
    )
    client = RecordingClient()
    async with running_agent(agent_args(later, sandbox), tmp_path / "agent.log", client) as agent:
        loaded = await agent.conn.load_session(cwd=str(repo), session_id=session.session_id, mcp_servers=[])
        assert loaded is not None and loaded.modes is not None and loaded.modes.current_mode_id == "auto"
        assert (await prompt(agent, session.session_id, "still fixed?")).stop_reason == "end_turn"
        grep = next(u for u in client.of(schema.ToolCallStart) if u.kind == "execute")
        assert _texts(_last_of(client, grep.tool_call_id)).strip("`\n ") == "1"
    assert not client.permissions  # the tree holds the changes: nothing to offer again
    assert (repo / "calculator.py").read_text(encoding="utf-8") == tree
    check_conformance(agent.messages)
