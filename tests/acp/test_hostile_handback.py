"""Hostile hand-backs over ACP: a hand-back is applied without a second question only when every
file is exactly the text an edit the person allowed left, from the file as the session found it,
as a plain file; a file the model deleted, made executable or turned into a symlink beside an
approved edit, or changed by a command under an approved edit, is asked about."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from acp import schema

from tests.acp.helpers import RecordingClient, agent_args, prompt, running_agent
from tests.git_repos import git
from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

CI = call("editor", command="create", path="/workspace/.github/workflows/ci.yml", file_text="on: push\n")
NOTE = call("editor", command="create", path="/workspace/notes.txt", file_text="AGENTS.md")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("calls", "after", "named"),
    [
        # an approved edit, then a file deleted by a command: the deletion is no edit's text
        ([FIX_ADD, call("shell", command="rm /workspace/AGENTS.md")], "AGENTS.md", None),
        # an approved edit, then the same file made executable: the text is the approved one
        (
            [FIX_ADD, call("shell", command="chmod +x /workspace/calculator.py")],
            "calculator.py",
            "executable bit set",
        ),
        # a file created with a symlink's target as its text, then swapped for that symlink
        (
            [NOTE, call("shell", command="cd /workspace && rm notes.txt && ln -s AGENTS.md notes.txt")],
            None,
            "a symlink to AGENTS.md",
        ),
        # a command changes a file, then an approved edit on top: the person saw the edit's diff,
        # not the command's change under it
        (
            [call("shell", command="echo 'import os' >> /workspace/calculator.py"), FIX_ADD],
            "calculator.py",
            None,
        ),
        # an approved edit of a CI workflow: a file a person says yes to by its path, named
        ([CI], None, ".github/workflows/ci.yml"),
    ],
    ids=["deleted", "chmod", "symlink", "command-then-edit", "ci"],
)
async def test_only_approved_plain_texts_skip_the_question(
    tmp_path: Path, calls: list[str], after: str | None, named: str | None
) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "hostile.jsonl",
        [*(turn("", c) for c in calls), turn("", call("finish", summary="Done."))],
    )
    client = RecordingClient(answers=["allow_once", "allow_once", "keep"])
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "go")).stop_reason == "end_turn"
    asked = [p for p in client.permissions if p.tool_call.tool_call_id.startswith("handback")]
    assert len(asked) == 1  # the hand-back was asked about, and kept
    (offer,) = [u for u in client.of(schema.ToolCallStart) if u.tool_call_id.startswith("handback")]
    said = "".join(c.content.text for c in offer.content or [] if c.type == "content")
    assert named is None or ("Look before applying:" in said and named in said), said
    assert git(repo, "status", "--porcelain").strip() == ""
    if after is not None:
        assert (repo / after).is_file()


@pytest.mark.slow
async def test_the_person_is_asked_about_the_arguments_a_hook_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PreToolUse hook's ``updatedInput`` is what runs: the question (its raw input and its diff)
    shows that, not the model's call, so an edit approved and then handed back unasked is the one
    the person saw."""
    repo = calculator_repo(tmp_path)
    hook = tmp_path / "times.py"
    hook.write_text(
        "import json, sys\njson.load(sys.stdin)\n"
        'new = \'    """Return the sum of a and b."""\\n    return a * b\'\n'
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
        " 'updatedInput': {'new_string': new}}}))\n"
    )
    settings = tmp_path / "config.toml"
    settings.write_text(f'[[hooks.PreToolUse]]\nmatcher = "Edit"\ncommand = "python3 {hook}"\n')
    monkeypatch.setenv("CLOVER_CONFIG", str(settings))
    replay = write_replay(
        tmp_path / "fix.jsonl", [turn("", FIX_ADD), turn("", call("finish", summary="Fixed."))]
    )
    client = RecordingClient(answers=["allow_once", "keep"])
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "end_turn"
    edit = client.permissions[0]
    assert isinstance(edit.tool_call.raw_input, dict)
    assert "return a * b" in edit.tool_call.raw_input["new_str"]
    (diff,) = [c for c in edit.tool_call.content or [] if c.type == "diff"]
    assert "return a * b" in diff.new_text and "return a + b" not in diff.new_text
    assert "return a * b" in (repo / "calculator.py").read_text(encoding="utf-8")


@pytest.mark.slow
async def test_an_editor_failing_to_write_fails_the_hand_back_not_the_prompt(tmp_path: Path) -> None:
    """The client cannot write the file (this one makes no folders): the hand-back says it failed
    and why; the prompt ends as it would."""
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "ci.jsonl", [turn("", CI), turn("", call("finish", summary="Done."))])
    client = RecordingClient(answers=["allow_once", "apply"])
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "add CI")).stop_reason == "end_turn"
    ended = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id.startswith("handback")][-1]
    said = "".join(c.content.text for c in ended.content or [] if c.type == "content")
    assert ended.status == "failed" and "the editor could not write" in said and "ci.yml" in said, said
    assert not (repo / ".github").exists()


#: The write that fails in the put-back tests (in a folder the recording client does not make).
LATE = call("editor", command="create", path="/workspace/zz/late.txt", file_text="last\n")


async def failed_hand_back(tmp_path: Path, repo: Path, calls: list[str], client: RecordingClient) -> str:
    """Run ``calls`` (each allowed, then the hand-back applied) over ACP; the hand-back must fail:
    what its tool call said."""
    replay = write_replay(
        tmp_path / "calls.jsonl", [*(turn("", c) for c in calls), turn("", call("finish", summary="Done."))]
    )
    client.answers = ["allow_once"] * len(calls) + ["apply"]
    async with running_agent(
        agent_args(replay, "local", "--policy", "ask"), tmp_path / "agent.log", client
    ) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert (await prompt(agent, session.session_id, "make the changes")).stop_reason == "end_turn"
    ended = [u for u in client.of(schema.ToolCallProgress) if u.tool_call_id.startswith("handback")][-1]
    said = "".join(c.content.text for c in ended.content or [] if c.type == "content")
    assert ended.status == "failed", said
    return said


@pytest.mark.slow
async def test_a_write_failing_midway_puts_back_the_files_written_before_it(tmp_path: Path) -> None:
    """Three files through the editor: an edit and a new file are written, then the third (in a
    folder this client does not make) fails. The hand-back is all or nothing: the edit's old text is
    written back through the editor, the new file removed, and the failure says so."""
    repo = calculator_repo(tmp_path)
    before = (repo / "calculator.py").read_text(encoding="utf-8")
    client = RecordingClient()
    said = await failed_hand_back(tmp_path, repo, [FIX_ADD, NOTE, LATE], client)
    assert "zz/late.txt" in said, said
    assert "put back as they were: calculator.py, notes.txt" in said, said
    assert (repo / "calculator.py").read_text(encoding="utf-8") == before  # written, then put back
    assert str(repo / "calculator.py") in client.written and not (repo / "notes.txt").exists()
    assert not (repo / "zz").exists()


@pytest.mark.slow
async def test_a_plan_answered_after_the_prompt_was_cancelled_is_not_approved(tmp_path: Path) -> None:
    """The client cancels the prompt while the plan's question is open, then (against the
    protocol, which asks for a cancelled outcome) answers it with an approval: the plan is not
    approved, the session stays in plan mode and nothing is edited."""
    repo = calculator_repo(tmp_path)
    propose = call("propose_plan", summary="Make add() add.", steps='["Fix add()"]')
    replay = write_replay(
        tmp_path / "plan.jsonl",
        [turn("", propose), turn("", FIX_ADD), turn("", call("finish", summary="Done."))],
    )
    client = RecordingClient(answers=["plan:auto", "apply"])
    async with running_agent(agent_args(replay, "local"), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        await agent.conn.set_session_mode(session_id=session.session_id, mode_id="plan")

        async def cancel() -> None:
            await agent.conn.cancel(session_id=session.session_id)

        client.before_answer = cancel
        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "cancelled"
    assert [u.current_mode_id for u in client.of(schema.CurrentModeUpdate)][-1] == "plan"
    assert len(client.permissions) == 1 and "return a - b" in (repo / "calculator.py").read_text()


@dataclass
class _EditedMeanwhile(RecordingClient):
    """An editor whose user changes ``calculator.py`` and ``notes.txt`` (already written by the
    hand-back) just before the editor fails to write ``zz/late.txt``."""

    async def write_text_file(self, session_id: str, path: str, content: str, **_: Any) -> None:
        if path.endswith("late.txt"):
            folder = Path(path).parent.parent
            (folder / "calculator.py").write_text("# the user's\n", encoding="utf-8")
            (folder / "notes.txt").write_text("the user's notes\n", encoding="utf-8")
        await super().write_text_file(session_id, path, content)


@pytest.mark.slow
async def test_a_put_back_keeps_what_the_user_changed_after_the_write(tmp_path: Path) -> None:
    """The hand-back's all-or-nothing put-back after a failed write touches only files that still
    hold what it wrote: an edit and a new file the user changed meanwhile are the user's, kept as
    they are, and the failure says so instead of saying they were put back."""
    repo = calculator_repo(tmp_path)
    client = _EditedMeanwhile()
    said = await failed_hand_back(tmp_path, repo, [FIX_ADD, NOTE, LATE], client)
    assert "zz/late.txt" in said, said
    assert (repo / "calculator.py").read_text(encoding="utf-8") == "# the user's\n"
    assert (repo / "notes.txt").read_text(encoding="utf-8") == "the user's notes\n"
    assert "put back as they were" not in said, said
    assert "changed since they were written, kept as they are: calculator.py, notes.txt" in said, said


@dataclass
class _MakesFolders(RecordingClient):
    """An editor that makes the folders a written file needs (as editors do) and refuses
    ``late.txt``."""

    async def write_text_file(self, session_id: str, path: str, content: str, **_: Any) -> None:
        if path.endswith("late.txt"):
            raise OSError("the editor refuses late.txt")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        await super().write_text_file(session_id, path, content)


@pytest.mark.slow
async def test_a_put_back_removes_the_folders_the_editor_made_for_a_new_file(tmp_path: Path) -> None:
    """A new file in new folders is written through the editor, which makes the folders; a later
    write fails. The put-back leaves the tree as it was: the file and the folders made for it gone,
    a folder that was there before kept."""
    repo = calculator_repo(tmp_path)
    (repo / "docs").mkdir()
    (repo / "docs" / "keep.md").write_text("kept\n", encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "docs")
    deep = call("editor", command="create", path="/workspace/aa/bb/new.txt", file_text="new\n")
    near = call("editor", command="create", path="/workspace/docs/new/more.md", file_text="more\n")
    client = _MakesFolders()
    said = await failed_hand_back(tmp_path, repo, [deep, near, LATE], client)
    assert "put back as they were: aa/bb/new.txt, docs/new/more.md" in said, said
    assert str(repo / "aa" / "bb" / "new.txt") in client.written
    assert not (repo / "aa").exists() and not (repo / "docs" / "new").exists()
    assert (repo / "docs" / "keep.md").read_text(encoding="utf-8") == "kept\n"
