"""The change an editor call would make, computed without making it: what a permission request
shows before the person answers (the editor's own rules: the same match ladder, the file's line
breaks). None where the call would fail or the change cannot be known beforehand (``undo_edit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clover_agent.errors import RUN_ERRORS
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import ToolError
from clover_agent.tools.editor import find_matches, insert_at, replace_matches
from clover_agent.tools.editor_view import lines_with_ends, read_text
from clover_agent.tools.paths import resolve_workspace_path


@dataclass(frozen=True)
class EditPreview:
    path: str  # as the model named it (in the sandbox)
    old: str | None  # None: no file yet
    new: str


async def preview_edit(sandbox: Sandbox, arguments: dict[str, Any]) -> EditPreview | None:
    """What ``editor`` with ``arguments`` would write (see the module docstring)."""
    command, path = arguments.get("command"), arguments.get("path")
    if not isinstance(path, str):
        return None
    try:
        real = await resolve_workspace_path(sandbox, path)
        if command == "create" and isinstance(arguments.get("file_text"), str):
            if await sandbox.stat(real) is not None:
                return None
            return EditPreview(path, None, arguments["file_text"])
        if command not in ("str_replace", "insert"):
            return None
        _, textfile = await read_text(sandbox, path, real)
    except (ToolError, OSError, *RUN_ERRORS):
        return None
    text, new_str = textfile.text, arguments.get("new_str", "")
    if not isinstance(new_str, str):
        return None
    if command == "str_replace":
        new = _replaced(text, arguments.get("old_str"), textfile.with_file_newlines(new_str), arguments)
    else:
        new = _inserted(
            text, arguments.get("insert_line"), textfile.with_file_newlines(new_str), textfile.newline
        )
    return None if new is None or new == text else EditPreview(path, text, new)


def _replaced(text: str, old_str: object, replacement: str, arguments: dict[str, Any]) -> str | None:
    if not isinstance(old_str, str) or not old_str:
        return None
    every = bool(arguments.get("replace_all", False))
    _, matches = find_matches(text, old_str, overlapping=not every)
    if not matches or (len(matches) > 1 and not every):
        return None
    return replace_matches(text, matches, replacement)


def _inserted(text: str, line: object, inserted: str, newline: str) -> str | None:
    lines = lines_with_ends(text)
    if not isinstance(line, int) or isinstance(line, bool) or not 0 <= line <= len(lines):
        return None
    return insert_at(text, lines, line, inserted, newline)
