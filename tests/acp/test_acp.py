"""``clover-agent acp`` driven by a real ACP client (the SDK's ``spawn_agent_process``) as a
subprocess, with the replay backend: initialize, a session, a prompt streaming thoughts and text,
tool calls with their kinds and an edit's diff, the verified hand-back through ``fs/write_text_file``
(or on disk), approvals answered each of the four ways, cancel mid tool call (its processes gone)
and the prompt after it, a second prompt, a saved session loaded after a restart, and session/new
refusing what cannot start. Every message both ways is checked against the protocol's schema."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from acp import RequestError, schema

from clover_agent import __version__
from tests.acp.helpers import (
    RecordingClient,
    agent_args,
    check_conformance,
    prompt,
    running_agent,
    wait_until,
)
from tests.clover_agent.fix.test_verdict_attacks import CHEATS as VERDICT_CHEATS
from tests.git_repos import git
from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

SANDBOXES = ["local", pytest.param("docker", marks=pytest.mark.docker)]
FIXED = '    """Return the sum of a and b."""\n    return a + b'


def _calls(client: RecordingClient) -> dict[str, schema.ToolCallStart]:
    return {u.tool_call_id: u for u in client.of(schema.ToolCallStart)}


def _progress(client: RecordingClient, call_id: str) -> list[schema.ToolCallProgress]:
    return [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id == call_id]


def _texts(update: schema.ToolCallProgress | schema.ToolCallStart) -> str:
    return "".join(
        c.content.text for c in update.content or [] if isinstance(c, schema.ContentToolCallContent)
    )


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_session_streams_edits_and_hands_back_through_the_editor(
    tmp_path: Path, sandbox: str
) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl",
        [
            turn("I read the code first.", call("editor", command="view", path="/workspace/calculator.py"),
                 think="The task names add; look at it."),
            turn("", call("search", pattern="def add"), think="Where else is add?"),
            turn("`add` subtracts.", FIX_ADD, think="Replace the operator."),
            turn("", call("run_tests"), think="Check the suite."),
            turn("", call("finish", summary="Fixed add."), think="All pass."),
            turn("", call("finish", summary="You are welcome."), think="Nothing to do."),
        ],
    )  # fmt: skip
    client = RecordingClient(answers=["apply"])
    async with running_agent(agent_args(replay, sandbox), tmp_path / "agent.log", client) as agent:
        assert agent.init is not None and agent.init.protocol_version == 1
        assert agent.init.agent_info is not None and agent.init.agent_info.version == __version__
        assert agent.init.agent_capabilities is not None and agent.init.agent_capabilities.load_session
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        first = await prompt(agent, session.session_id, "fix add in calculator.py")
        assert first.stop_reason == "end_turn"

        assert "The task names add" in client.text(schema.AgentThoughtChunk)
        said = client.text()
        assert "I read the code first." in said and "`add` subtracts." in said and "Fixed add." in said
        assert "<tool_call>" not in said and "<function=" not in said
        calls = list(_calls(client).values())
        kinds = [c.kind for c in calls]
        assert kinds == ["read", "search", "edit", "execute", "think", "edit"]  # the last: the hand-back
        read, search, edit, tests = calls[:4]
        assert search.title == "Search def add"
        assert "calculator.py" in _texts(_progress(client, search.tool_call_id)[-1])
        assert read.locations and read.locations[0].path == str(repo / "calculator.py")
        assert read.status == "in_progress" and _progress(client, read.tool_call_id)[-1].status == "completed"
        (diff,) = [c for c in _progress(client, edit.tool_call_id)[-1].content or [] if c.type == "diff"]
        assert diff.path == str(repo / "calculator.py")
        assert "return a - b" in (diff.old_text or "") and FIXED in diff.new_text
        table = _texts(_progress(client, tests.tool_call_id)[-1])
        assert "| passed | failed |" in table and "| 0 |" in table  # a test table as text, nothing failing
        assert client.of(schema.UsageUpdate)

        # the hand-back: judged as `fix` judges (held out: the failing test is the target), offered
        # with its verdict, accepted, written through the editor
        (offer,) = [p for p in client.permissions if p.tool_call.tool_call_id.startswith("handback")]
        title = offer.tool_call.title or ""
        assert title == "Hand back 1 file (fixed)", title
        verdict = _texts(_calls(client)[offer.tool_call.tool_call_id])
        assert verdict.startswith("Verdict: fixed: the target passes and no test that passed before fails")
        assert {o.kind for o in offer.options} == {"allow_once", "reject_once"}
        assert list(client.written) == [str(repo / "calculator.py")]
        assert FIXED in (repo / "calculator.py").read_text(encoding="utf-8")
        handback = _progress(client, calls[5].tool_call_id)[-1]
        assert handback.status == "completed" and "Applied through the editor" in _texts(handback)

        # a second prompt in the same session and sandbox: the conversation goes on
        before = len(client.updates)
        second = await prompt(agent, session.session_id, "thanks")
        assert second.stop_reason == "end_turn"
        assert "You are welcome." in "".join(
            u.content.text for u in client.updates[before:] if isinstance(u, schema.AgentMessageChunk)
        )
        assert len(client.permissions) == 1  # nothing changed since the hand-back: nothing offered
    assert agent.process.returncode == 0
    assert check_conformance(agent.messages) > 10


@pytest.mark.slow
async def test_without_the_editor_writing_files_the_hand_back_goes_to_disk(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["apply"])
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client, fs_write=False) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "end_turn"
    assert not client.written
    assert FIXED in (repo / "calculator.py").read_text(encoding="utf-8")
    assert git(repo, "status", "--porcelain").strip() == "M calculator.py"
    check_conformance(agent.messages)


@pytest.mark.slow
async def test_the_hand_back_refused_leaves_the_tree_alone(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["keep"])
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add")
    assert not client.written and git(repo, "status", "--porcelain").strip() == ""
    (last,) = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id.startswith("handback")]
    assert "Kept in the sandbox" in _texts(last)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_approvals_answered_each_of_the_four_ways(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    shell = lambda text: call("shell", command=f"echo {text} >> /workspace/said.txt; echo {text}")  # noqa: E731
    replay = write_replay(
        tmp_path / "asks.jsonl",
        [
            turn("", shell("once")),  # allow once: runs
            turn("", shell("twice")),  # allow always: runs ...
            turn("", shell("twice")),  # ... and the same command again is not asked
            turn("", shell("never")),  # reject once: refused
            turn("", shell("never")),  # asked again: reject always
            turn("", shell("never")),  # refused without asking
            turn("", call("finish", summary="done")),
        ],
    )
    client = RecordingClient(answers=["allow_once", "allow_always", "reject_once", "reject_always", "keep"])
    args = agent_args(replay, sandbox, "--policy", "ask")
    async with running_agent(args, tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "say things")).stop_reason == "end_turn"
    asked = [p for p in client.permissions if not p.tool_call.tool_call_id.startswith("handback")]
    assert len(asked) == 4
    for request in asked:
        assert request.tool_call.kind == "execute"
        said = [c.content.text for c in request.tool_call.content or [] if c.type == "content"]
        command = request.tool_call.raw_input["command"]
        assert f"Allow always: allows `shell` running exactly `{command}` again" in said[1], said
        assert said[2].startswith(f"Reject always: refuses `{command}` without asking"), said
        assert [o.kind for o in request.options] == [
            "allow_once",
            "allow_always",
            "reject_once",
            "reject_always",
        ]
    calls = [c for c in _calls(client).values() if c.kind == "execute"]
    outcomes = [_progress(client, c.tool_call_id)[-1].status for c in calls]
    assert outcomes == ["completed", "completed", "completed", "failed", "failed", "failed"]
    (offer,) = [p for p in client.permissions if p.tool_call.tool_call_id.startswith("handback")]
    diff = next(
        c for c in _progress(client, offer.tool_call.tool_call_id)[-1].content or [] if c.type == "diff"
    )
    assert diff.new_text == "once\ntwice\ntwice\n"  # what ran, and only that
    check_conformance(agent.messages)


def _sleepers(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_cancel_mid_tool_call_stops_it_and_the_next_prompt_goes_on(
    tmp_path: Path, sandbox: str
) -> None:
    repo = calculator_repo(tmp_path)
    marker = "347.25"
    replay = write_replay(
        tmp_path / "slow.jsonl",
        [
            turn("Waiting.", call("shell", command=f"sleep {marker}")),
            turn("", call("shell", command=f"ps -eo args | grep -v grep | grep -c 'sleep {marker}' || true")),
            turn("", call("finish", summary="Stopped waiting.")),
        ],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay, sandbox), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "wait a while"))
        await wait_until(
            lambda: any(c.kind == "execute" for c in _calls(client).values()), "the command to start"
        )
        if sandbox == "local":
            await wait_until(lambda: _sleepers(f"sleep {marker}"), "the sleep process")
        await agent.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "cancelled"
        (sleep,) = [c for c in _calls(client).values() if c.kind == "execute"]
        assert _progress(client, sleep.tool_call_id)[-1].status == "failed"
        if sandbox == "local":
            assert not _sleepers(f"sleep {marker}")

        # the next prompt is the message the interrupted agent goes on with
        assert (await prompt(agent, session.session_id, "never mind")).stop_reason == "end_turn"
        count = next(c for c in _calls(client).values() if c.title and "grep -c" in c.title)
        assert _texts(_progress(client, count.tool_call_id)[-1]).strip("`\n ") == "0"  # no sleep left inside
        assert "Stopped waiting." in client.text()
    check_conformance(agent.messages)


@pytest.mark.slow
async def test_the_prompt_after_a_cancel_is_screened_by_user_prompt_submit_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a cancel the editor's next prompt is a new request (the last one ended "cancelled"),
    though the paused run takes it: a UserPromptSubmit hook screens it, and a block keeps it from
    the model, says why, and leaves the agent waiting for the next prompt."""
    repo = calculator_repo(tmp_path)
    log = tmp_path / "prompts.txt"
    hook = tmp_path / "screen.py"
    hook.write_text(
        "import json, sys\nprompt = json.load(sys.stdin)['prompt']\n"
        f"open({str(log)!r}, 'a').write(prompt + '\\n')\n"
        "if 'password' in prompt:\n    print('no secrets in requests', file=sys.stderr)\n    sys.exit(2)\n"
    )
    settings = tmp_path / "config.toml"
    settings.write_text(f'[[hooks.UserPromptSubmit]]\ncommand = "python3 {hook}"\n')
    monkeypatch.setenv("CLOVER_CONFIG", str(settings))
    marker = "348.25"
    replay = write_replay(
        tmp_path / "slow.jsonl",
        [
            turn("Waiting.", call("shell", command=f"sleep {marker}")),
            turn("", call("finish", summary="Done.")),
        ],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "wait a while"))
        await wait_until(lambda: _sleepers(f"sleep {marker}"), "the sleep process")
        await agent.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "cancelled"
        await prompt(agent, session.session_id, "the password is hunter2")
        assert "not sent to the model: no secrets in requests" in client.text()
        assert (await prompt(agent, session.session_id, "never mind")).stop_reason == "end_turn"
        assert "Done." in client.text()
    assert log.read_text().splitlines() == ["wait a while", "the password is hunter2", "never mind"]
    check_conformance(agent.messages)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_a_saved_session_loads_after_a_restart(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    first = write_replay(
        tmp_path / "first.jsonl", [turn("Fixing.", FIX_ADD), turn("", call("finish", summary="Fixed add."))]
    )
    async with running_agent(
        agent_args(first), tmp_path / "agent.log", RecordingClient(answers=["keep"])
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add please")
    assert agent.process.returncode == 0

    later = write_replay(tmp_path / "later.jsonl", [turn("", call("shell", command="grep -c 'a + b' /workspace/calculator.py")),
                                                    turn("", call("finish", summary="Still fixed."))])  # fmt: skip
    client = RecordingClient(answers=["keep"])
    async with running_agent(agent_args(later, sandbox), tmp_path / "agent.log", client) as agent:
        await agent.conn.load_session(cwd=str(repo), session_id=session.session_id, mcp_servers=[])
        assert client.text(schema.UserMessageChunk) == "fix add please"
        assert "Fixing." in client.text() and "Fixed add." in client.text()
        replayed = [c.kind for c in _calls(client).values()]
        assert replayed == ["edit", "think"]
        assert (await prompt(agent, session.session_id, "is it still fixed?")).stop_reason == "end_turn"
        grep = next(c for c in _calls(client).values() if c.kind == "execute")
        assert (
            _texts(_progress(client, grep.tool_call_id)[-1]).strip("`\n ") == "1"
        )  # the workspace came back
        assert "Still fixed." in client.text()
    # the first session's change, never applied, is offered again with the loaded session's work
    (offer,) = [u for u in _calls(client).values() if u.tool_call_id.startswith("handback")]
    (diff,) = [c for c in offer.content or [] if c.type == "diff"]
    assert _texts(offer).startswith("Verdict: fixed: ")  # judged as fix judges: test_add failed at the start
    assert diff.type == "diff" and diff.path == str(repo / "calculator.py") and FIXED in diff.new_text
    check_conformance(agent.messages)


@pytest.mark.slow
async def test_session_new_says_what_cannot_start(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    missing = tmp_path / "missing.jsonl"
    async with running_agent(agent_args(missing), tmp_path / "agent.log") as agent:
        with pytest.raises(RequestError) as raised:
            await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert raised.value.code == -32001 and f"--replay {missing}: no such file" in str(raised.value)
        with pytest.raises(RequestError) as unknown:
            await agent.conn.load_session(cwd=str(repo), session_id="20200101-000000-abcdef", mcp_servers=[])
        assert unknown.value.code == -32001
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="x"))])
    async with running_agent(agent_args(replay), tmp_path / "agent.log") as agent:
        with pytest.raises(RequestError) as raised:
            await agent.conn.new_session(cwd=str(plain), mcp_servers=[])
        assert "is not in a git repository" in str(raised.value)
    check_conformance(agent.messages)
    no_model = tmp_path / "no-weights"
    async with running_agent(
        ["-m", "clover_agent", "acp", "--model", str(no_model)], tmp_path / "agent.log"
    ) as agent:
        with pytest.raises(RequestError) as raised:
            await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert raised.value.code == -32001 and str(no_model) in str(raised.value)


def _containers(pid: int) -> list[str]:
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=clover-agent.owner-pid={pid}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return found.stdout.split()


@pytest.mark.slow
@pytest.mark.docker
async def test_sigterm_removes_the_sessions_sandboxes(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="x"))])
    async with running_agent(agent_args(replay, "docker"), tmp_path / "agent.log") as agent:
        await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert len(_containers(agent.process.pid)) == 1
        agent.process.terminate()
        assert await asyncio.wait_for(agent.process.wait(), 60) == 130
        assert _containers(agent.process.pid) == []


@pytest.mark.slow
async def test_a_file_changed_meanwhile_is_merged_not_overwritten(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["apply"])
    async with running_agent(agent_args(replay), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        mine = (repo / "calculator.py").read_text(encoding="utf-8") + "\n# my own work\n"
        (repo / "calculator.py").write_text(mine, encoding="utf-8")  # while the agent works
        await prompt(agent, session.session_id, "fix add")
    assert not client.written  # merged on disk: the editor's write would take the agent's text whole
    text = (repo / "calculator.py").read_text(encoding="utf-8")
    assert text.endswith("# my own work\n") and "return a + b" in text
    (last,) = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id.startswith("handback")]
    assert last.status == "completed" and "calculator.py: merged with your edits" in _texts(last)


@pytest.mark.slow
async def test_a_spent_budget_ends_the_turn_and_says_why(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    view = call("editor", command="view", path="/workspace/calculator.py")
    replay = write_replay(tmp_path / "r.jsonl", [turn("", view), turn("", view), turn("", view)])
    client = RecordingClient()
    async with running_agent(
        agent_args(replay, "local", "--max-steps", "2"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "look")).stop_reason == "max_turn_requests"
    assert "The agent stopped:" in client.text() and "step" in client.text()
    assert not client.permissions  # no finish: nothing offered


async def test_a_prose_answer_ends_the_turn_with_nothing_offered(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    answer = "`add` returns a - b: it subtracts, so test_add fails."
    replay = write_replay(tmp_path / "r.jsonl", [turn(answer)])
    client = RecordingClient()
    async with running_agent(agent_args(replay, "local"), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "why does test_add fail?")).stop_reason == "end_turn"
    assert answer in client.text()
    assert "The agent stopped" not in client.text() and "format" not in client.text()
    assert not client.permissions  # nothing changed: nothing offered


@pytest.mark.slow
async def test_sessions_are_the_tuis_and_embedded_files_reach_the_model(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "r.jsonl", [turn("", call("finish", summary="Seen."))])
    uri = (repo / "calculator.py").as_uri()
    text = (repo / "calculator.py").read_text(encoding="utf-8")
    blocks = [
        schema.TextContentBlock(type="text", text="what does this do?"),
        schema.EmbeddedResourceContentBlock(
            type="resource",
            resource=schema.TextResourceContents(uri=uri, text=text, mime_type="text/x-python"),
        ),
    ]
    async with running_agent(agent_args(replay), tmp_path / "agent.log") as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (
            await agent.conn.prompt(session_id=session.session_id, prompt=blocks)
        ).stop_reason == "end_turn"

    from clover_agent.events import MessageAdded
    from clover_agent.session.store import list_sessions, load_session
    from tests.tui.helpers import session_key

    key = session_key(repo)
    assert [s.session_id for s in list_sessions(repo, key)] == [session.session_id]
    saved = load_session(repo, session.session_id, key)  # what `clover-agent tui --resume ID` reads
    assert saved.info.title == "what does this do?" and saved.state is not None
    asked = [
        e.message["content"]
        for e in saved.events
        if isinstance(e, MessageAdded) and e.message["role"] == "user"
    ]
    # the file as the model knows it: in the sandbox's workspace
    assert asked[0].startswith("what does this do?") and text in asked[0]
    assert '<file uri="file:///workspace/calculator.py">' in asked[0]


@pytest.mark.slow
async def test_a_running_command_sends_its_output_before_it_ends(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "gate"  # the test decides when the command goes on
    command = f"echo acp-first-line; while [ ! -e {gate} ]; do sleep 0.05; done; echo acp-second-line"
    replay = write_replay(
        tmp_path / "stream.jsonl",
        [turn("", call("shell", command=command)), turn("", call("finish", summary="Ran it."))],
    )
    client = RecordingClient()
    async with running_agent(agent_args(replay, "local"), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answer = asyncio.ensure_future(prompt(agent, session.session_id, "run it"))
        await wait_until(lambda: any(c.kind == "execute" for c in _calls(client).values()), "the command")
        (run,) = [c for c in _calls(client).values() if c.kind == "execute"]
        await wait_until(
            lambda: any("acp-first-line" in _texts(u) for u in _progress(client, run.tool_call_id)),
            "the streamed output",
        )
        assert all(u.status is None for u in _progress(client, run.tool_call_id))  # still running
        gate.touch()
        assert (await asyncio.wait_for(answer, 60)).stop_reason == "end_turn"
        last = _progress(client, run.tool_call_id)[-1]
        assert last.status == "completed" and "acp-first-line\nacp-second-line" in _texts(last)
    check_conformance(agent.messages)


#: ``add`` right only where the code under test sees pytest: each class of the fix CLI's hostile
#: replays (tests/clover_agent/fix/test_verdict_attacks.py), and two more spellings of two of them.
CHEATS = {
    **{how: source for how, (source, _layers) in VERDICT_CHEATS.items()},
    "environment by a computed getter": "import os\n\n\ndef add(a, b):\n"
    "    if getattr(os, 'get' + 'env')('PYTEST_' + 'CURRENT_TEST'):\n        return a + b\n    return a - b\n",
    "always equal by a double negation": "class _Sum(float):\n    def __eq__(self, other):\n        return not False\n\n\n"
    "def add(a, b):\n    return _Sum(a - b)\n",
}


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("how", list(CHEATS))
async def test_a_hand_back_whose_code_fakes_its_pass_needs_review_and_never_says_verified(
    tmp_path: Path, how: str
) -> None:
    cheat = CHEATS[how]
    repo = calculator_repo(tmp_path)
    rest = (repo / "calculator.py").read_text(encoding="utf-8").split("def subtract", 1)[1]
    write = call("editor", command="str_replace", path="/workspace/calculator.py",
                 old_str=(repo / "calculator.py").read_text(encoding="utf-8"), new_str=cheat + "\n\ndef subtract" + rest)  # fmt: skip
    replay = write_replay(
        tmp_path / "cheat.jsonl", [turn("", write), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["keep"])
    async with running_agent(agent_args(replay, "docker"), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await prompt(agent, session.session_id, "fix add")
    (offer,) = [p for p in client.permissions if p.tool_call.tool_call_id.startswith("handback")]
    title = offer.tool_call.title or ""
    assert title in ("Hand back 1 file (needs review)", "Hand back 1 file (not fixed)"), title
    verdict = _texts(_calls(client)[offer.tool_call.tool_call_id])
    if title.endswith("(needs review)"):  # the findings listed, file and line first
        assert "Look before applying:\n- calculator.py:" in verdict, verdict
    else:  # a forged record loses to the real one: the run says what failed
        assert verdict.startswith("Verdict: not fixed: "), verdict
    assert "verified" not in verdict.lower() and not verdict.startswith("Verdict: fixed")
    assert not client.written and git(repo, "status", "--porcelain").strip() == ""
    assert "return a - b" in (repo / "calculator.py").read_text(encoding="utf-8").split("def subtract")[0]
    check_conformance(agent.messages)
