"""A tool call as a hook reads it, with Claude Code's names beside ours, and a hook's
``updatedInput`` read back into our arguments.

A Claude Code script reads ``tool_input.command`` (Bash) or ``tool_input.file_path`` (Edit, Write,
Read): each call's ``tool_input`` holds our arguments and, where the tool has an equivalent, the
same values under Claude Code's names, so such a script works unchanged. ``file_path`` is the file
where the hook runs: the user's file for a hook on the host, the workspace's in the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from clover_agent.sandboxes.base import WORKSPACE

#: The editor's commands as Claude Code's tools.
_EDITOR = {"view": "Read", "create": "Write", "str_replace": "Edit", "insert": "Edit", "undo_edit": "Edit"}
#: Our editor argument -> Claude Code's name for it.
_EDITOR_NAMES = {"old_str": "old_string", "new_str": "new_string", "file_text": "content"}


def aliases(name: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The names a call is known by to a matcher: our tool's name, then Claude Code's."""
    if name == "shell":
        return (name, "Bash")
    if name == "editor":
        claude = _EDITOR.get(str(arguments.get("command", "")))
        return (name, claude) if claude else (name,)
    if name == "search":
        return (name, "Grep", "Glob")
    return (name,)


def relative(path: str) -> str | None:
    """A workspace path (absolute under the workspace, or relative to it) as a path inside it;
    None when it leads out."""
    pure = PurePosixPath(path)
    if pure.is_absolute():
        if not pure.is_relative_to(WORKSPACE):
            return None
        pure = pure.relative_to(WORKSPACE)
    if ".." in pure.parts:
        return None
    return str(pure)


def hook_view(name: str, arguments: Mapping[str, Any], root: str) -> dict[str, Any]:
    """``tool_input`` for a call: our arguments plus Claude Code's names; ``root`` is where the
    workspace's files are for the hook (the user's repository, or the sandbox's workspace)."""
    view = dict(arguments)
    if name == "editor":
        for ours, theirs in _EDITOR_NAMES.items():
            if ours in arguments:
                view[theirs] = arguments[ours]
        inside = relative(str(arguments.get("path", "")))
        if inside is not None:
            view["file_path"] = str(PurePosixPath(root) / inside) if inside != "." else root
    return view


def from_hook(
    name: str, original: Mapping[str, Any], updated: Mapping[str, Any], roots: tuple[str, ...]
) -> dict[str, Any]:
    """Our arguments after a hook's ``updatedInput``: its keys, in our names or Claude Code's,
    replace those of ``original`` (where both name one argument, the one that changes it wins);
    a ``file_path`` under one of ``roots`` becomes the workspace path (any other path is passed as
    given, and the tool and the policy judge it as they would the model's)."""
    result = dict(original)
    pairs = dict(_EDITOR_NAMES, path="file_path") if name == "editor" else {}
    theirs = set(pairs.values())
    for key, value in updated.items():
        if key not in theirs:
            result[key] = value
    for ours, claude in pairs.items():
        if claude not in updated:
            continue
        value = updated[claude]
        if ours == "path" and isinstance(value, str):
            value = _to_workspace(value, roots)
        if ours not in updated or updated[ours] == original.get(ours):
            result[ours] = value
    return result


def _to_workspace(path: str, roots: tuple[str, ...]) -> str:
    pure = PurePosixPath(path)
    for root in roots:
        if pure.is_relative_to(root):
            rest = pure.relative_to(root)
            if ".." not in rest.parts:
                return str(PurePosixPath(WORKSPACE) / rest)
    return path
