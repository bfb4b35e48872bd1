"""The change an edit's permission request shows is the change the editor then makes: each case's
preview is compared with what the real editor tool writes in a real sandbox, and a call that
would fail (no match, several, a path outside the workspace, a file that exists) previews nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from clover_agent.acp.preview import preview_edit
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.base import ToolContext
from clover_agent.tools.editor import EditorTool
from clover_agent.tools.registry import run_call
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

FILES: dict[str, str | bytes] = {
    "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
    "open.txt": "first\nlast line without a break",
    "many.py": "x = 1\nx = 1\ny = 2\n",
}


@pytest_asyncio.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    repo = make_repo(tmp_path / "repo", FILES)
    (repo / "outside").symlink_to("/etc")
    async with create_sandbox("local", sandbox_spec(repo)) as sb:
        yield sb


CHANGES: list[dict[str, Any]] = [
    {"command": "str_replace", "path": "/workspace/crlf.txt", "old_str": "two\nthree", "new_str": "2\n3"},
    {"command": "str_replace", "path": "/workspace/many.py", "old_str": "x = 1", "new_str": "x = 9", "replace_all": True},
    {"command": "insert", "path": "/workspace/open.txt", "insert_line": 2, "new_str": "after"},
    {"command": "insert", "path": "/workspace/crlf.txt", "insert_line": 0, "new_str": "zero"},
    {"command": "create", "path": "/workspace/new/file.txt", "file_text": "fresh\n"},
]  # fmt: skip
FAILING: list[dict[str, Any]] = [
    {"command": "str_replace", "path": "/workspace/many.py", "old_str": "x = 1", "new_str": "x = 9"},
    {"command": "str_replace", "path": "/workspace/many.py", "old_str": "absent", "new_str": "x"},
    {"command": "str_replace", "path": "/workspace/outside/passwd", "old_str": "root", "new_str": "toor"},
    {"command": "str_replace", "path": "/workspace/../etc/passwd", "old_str": "root", "new_str": "toor"},
    {"command": "insert", "path": "/workspace/open.txt", "insert_line": 99, "new_str": "x"},
    {"command": "create", "path": "/workspace/many.py", "file_text": "over"},
    {"command": "undo_edit", "path": "/workspace/many.py"},
]  # fmt: skip


@pytest.mark.parametrize("arguments", CHANGES, ids=lambda a: f"{a['command']}:{a['path']}")
async def test_the_preview_is_what_the_editor_writes(sandbox: Sandbox, arguments: dict[str, Any]) -> None:
    preview = await preview_edit(sandbox, arguments)
    result = await run_call(EditorTool(), arguments, ToolContext(sandbox))
    assert result.ok, result.output
    assert preview is not None and preview.path == arguments["path"]
    assert preview.old == result.data["old_content"] and preview.new == result.data["new_content"]


@pytest.mark.parametrize("arguments", FAILING, ids=lambda a: f"{a['command']}:{a['path']}")
async def test_a_call_that_would_fail_previews_nothing(sandbox: Sandbox, arguments: dict[str, Any]) -> None:
    assert await preview_edit(sandbox, arguments) is None
