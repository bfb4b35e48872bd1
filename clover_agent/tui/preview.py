"""The change an editor call asks for, as a unified diff, shown before the person approves it.

Nothing is written: the file is read through the sandbox and the call's arguments are laid over it.
``create`` is the whole new text against the current one; ``str_replace`` with exactly one exact
match is that replacement in its file (``replace_all``: every match); ``insert`` puts the text after
its line. Anything else (no exact match, where the editor would try its looser matching, or a file
that cannot be read as text) falls back to the call's own old and new text, so the person still
sees what would change.
"""

from __future__ import annotations

import difflib
import posixpath
from typing import Any

from clover_agent.sandboxes.base import WORKSPACE, Sandbox


def _lines(text: str) -> list[str]:
    """Lines with their ends; a last line without one gets one (the diff is for reading)."""
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]


def _diff(path: str, old: str, new: str) -> str:
    shown = path.removeprefix(WORKSPACE + "/")
    return "".join(difflib.unified_diff(_lines(old), _lines(new), f"a/{shown}", f"b/{shown}"))


async def _read(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.read_file(path)).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


async def edit_preview(sandbox: Sandbox, name: str, arguments: dict[str, Any]) -> str:
    """The diff an editor call would make (see the module docstring); "" for other calls."""
    command, path = arguments.get("command"), arguments.get("path")
    if name != "editor" or not isinstance(path, str):
        return ""
    path = posixpath.normpath(posixpath.join(WORKSPACE, path))
    if command == "create":
        return _diff(path, await _read(sandbox, path) or "", str(arguments.get("file_text", "")))
    old_str, new_str = str(arguments.get("old_str", "")), str(arguments.get("new_str", ""))
    current = await _read(sandbox, path)
    if command == "str_replace":
        if current is not None and old_str and (current.count(old_str) == 1 or arguments.get("replace_all")):
            count = -1 if arguments.get("replace_all") else 1
            return _diff(path, current, current.replace(old_str, new_str, count))
        return _diff(path, old_str, new_str)
    if command == "insert":
        line = arguments.get("insert_line")
        if current is not None and isinstance(line, int) and 0 <= line <= len(current.splitlines()):
            lines = current.splitlines(keepends=True)
            if lines and not lines[-1].endswith("\n") and line == len(lines):
                lines[-1] += "\n"
            insert = new_str if new_str.endswith("\n") else new_str + "\n"
            return _diff(path, current, "".join([*lines[:line], insert, *lines[line:]]))
        return _diff(path, "", new_str)
    return ""
