"""Specs the model sees, argument validation, and ``execute`` never raising."""

from __future__ import annotations

import gc
import logging
import weakref
from pathlib import Path

import jsonschema
import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.base import ToolContext
from clover_agent.tools.registry import SANDBOX_LOST, TOOL_NAMES, default_tools, execute, tool_specs
from tests.sandbox_specs import sandbox_spec

in_module_loop = pytest.mark.asyncio(loop_scope="module")

# Names and parameters fixed by docs/tools.md ("extend, don't rename").
DESIGNED = {
    "editor": {
        "command",
        "path",
        "file_text",
        "old_str",
        "new_str",
        "insert_line",
        "view_range",
        "replace_all",
    },
    "shell": {"command", "timeout"},
    "run_tests": {"target"},
    "search": {"pattern", "path", "glob"},
    "finish": {"summary"},
}


def test_specs_are_openai_style_with_valid_schemas() -> None:
    specs = tool_specs()
    assert [s["function"]["name"] for s in specs] == list(DESIGNED)
    for spec in specs:
        assert spec["type"] == "function"
        function = spec["function"]
        assert function["description"].strip()
        jsonschema.Draft202012Validator.check_schema(function["parameters"])
        assert set(function["parameters"]["properties"]) == DESIGNED[function["name"]]
    assert tuple(s["function"]["name"] for s in specs) == TOOL_NAMES
    first, second = default_tools(), default_tools()
    assert all(a is not b for a, b in zip(first, second, strict=True))  # each owner gets its own


def test_each_tool_says_what_a_call_is_for_the_policy() -> None:
    tools = {tool.name: tool for tool in default_tools()}
    editor, shell = tools["editor"], tools["shell"]
    assert editor.action({"command": "view"}) == "editor:view" and not editor.mutates({"command": "view"})
    assert all(editor.mutates({"command": c}) for c in ("create", "str_replace", "insert", "undo_edit"))
    assert shell.mutates({"command": "ls"}) and shell.command_line({"command": "ls"}) == "ls"
    for name in ("run_tests", "search", "finish"):
        assert tools[name].action({}) == name and not tools[name].mutates({})
        assert tools[name].command_line({}) is None


@in_module_loop
async def test_bad_calls_come_back_as_tool_errors(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    unknown = await execute("browser", {"url": "x"}, ctx)
    assert not unknown.ok
    assert (
        unknown.output == "Unknown tool `browser`. Available tools: editor, shell, run_tests, search, finish."
    )
    missing = await execute("editor", {"command": "view"}, ctx)
    assert missing.output == "Invalid arguments for tool `editor`: 'path' is a required property"
    wrong_type = await execute("editor", {"command": "view", "path": "/workspace", "view_range": "1-2"}, ctx)
    assert (
        wrong_type.output == "Invalid arguments for tool `editor`: `view_range`: '1-2' is not of type 'array'"
    )
    extra = await execute("shell", {"command": "true", "cwd": "/"}, ctx)
    assert "Additional properties are not allowed ('cwd' was unexpected)" in extra.output
    not_object = await execute("finish", ["done"], ctx)  # type: ignore[arg-type]
    assert not_object.output == "Invalid arguments for tool `finish`: expected a JSON object, got list."
    # Arguments arrive parsed (the caller decodes JSON once); text is not an object.
    as_text = await execute("finish", '{"summary": "all green"}', ctx)  # type: ignore[arg-type]
    assert as_text.output == "Invalid arguments for tool `finish`: expected a JSON object, got str."
    done = await execute("finish", {"summary": "all green"}, ctx)
    assert done.ok and done.ends_task and done.data["summary"] == "all green"


@in_module_loop
async def test_context_follows_the_sandbox(sandbox: Sandbox) -> None:
    """Passing the sandbox itself keeps edit history and the shell session between calls."""
    await sandbox.write_file("/workspace/ctx.txt", b"one\n")
    await execute(
        "editor",
        {"command": "str_replace", "path": "/workspace/ctx.txt", "old_str": "one", "new_str": "two"},
        sandbox,
    )
    undo = await execute("editor", {"command": "undo_edit", "path": "/workspace/ctx.txt"}, sandbox)
    assert undo.ok and await sandbox.read_file("/workspace/ctx.txt") == b"one\n"
    await execute("shell", {"command": "cd src"}, sandbox)
    assert (await execute("shell", {"command": "pwd"}, sandbox)).output == "/workspace/src\n[exit code: 0]"
    first, again = ToolContext.of(sandbox), ToolContext.of(sandbox)
    assert first.session_id == again.session_id and first.edit_history is again.edit_history


@in_module_loop
async def test_contexts_do_not_keep_sandboxes_alive(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    sb = create_sandbox("local", sandbox_spec(tmp_path / "r"))
    async with sb:
        assert (await execute("shell", {"command": "true"}, sb)).ok
    gone = weakref.ref(sb)
    del sb
    gc.collect()
    assert gone() is None


@in_module_loop
async def test_a_broken_sandbox_never_raises(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    sb = create_sandbox("local", sandbox_spec(tmp_path / "r"))
    await sb.start()
    await sb.close()  # every tool call now meets a dead sandbox
    for name, args in [
        ("editor", {"command": "view", "path": "/workspace"}),
        ("shell", {"command": "true"}),
        ("search", {"pattern": "x"}),
        ("run_tests", {}),
    ]:
        result = await execute(name, args, sb)
        assert not result.ok and f"The tool `{name}` failed" in result.output


@in_module_loop
async def test_a_sandbox_dying_mid_call_is_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The result tells the model and marks the loss; the log gets one line, the traceback only at
    debug level (no traceback reaches a user's terminal)."""
    (tmp_path / "r").mkdir()
    caplog.set_level(logging.DEBUG, logger="clover_agent.tools.registry")
    async with create_sandbox("local", sandbox_spec(tmp_path / "r")) as sb:
        result = await execute("shell", {"command": "kill -9 $PPID; sleep 30"}, sb)  # kills the runner
    assert not result.ok and "the sandbox stopped working" in result.output
    assert "runner exited" in result.data[SANDBOX_LOST]
    records = [r for r in caplog.records if r.name == "clover_agent.tools.registry"]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert "\n" not in warnings[0].getMessage()
    assert [r.levelno for r in records if r.exc_info] == [logging.DEBUG]
