"""Path policy for every tool: absolute paths inside ``/workspace``, nothing else.

A path is accepted when it is absolute, stays inside the workspace after ``..`` is folded, and
still does once the sandbox resolves its symlinks (``Sandbox.realpath``). Everything else is
refused with a message that says why and, for a relative path, which absolute path was probably
meant.
"""

from __future__ import annotations

import posixpath

from clover_agent.sandboxes.base import WORKSPACE, FileEntry, Sandbox
from clover_agent.tools.base import ToolError


def is_inside_workspace(path: str) -> bool:
    """Whether a normalised absolute path is ``/workspace`` or below it."""
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def workspace_relative(path: str) -> str:
    """``/workspace/a/b`` as ``a/b`` (``.`` for the workspace itself), for commands run there.

    Commands get relative paths with ``cwd=/workspace`` because only the sandbox's own operations
    map ``/workspace`` (the local sandbox runs commands on the host, in its private copy).
    """
    if path == WORKSPACE:
        return "."
    return path[len(WORKSPACE) + 1 :]


async def resolve_workspace_path(sandbox: Sandbox, path: str) -> str:
    """The resolved form of ``path`` (the one to read and write), after checking it stays inside.

    Raises :class:`ToolError` for a relative path, a path outside ``/workspace``, a ``..`` that
    climbs out, or a symlink (anywhere along the path) that resolves outside.
    """
    if not path.strip():
        raise ToolError(
            "The path is empty. Use an absolute path inside /workspace, e.g. /workspace/README.md."
        )
    if not path.startswith("/"):
        suggested = posixpath.normpath(posixpath.join(WORKSPACE, path))
        hint = (
            f"maybe you meant {suggested}?"
            if is_inside_workspace(suggested)
            else f"it must be inside {WORKSPACE}."
        )
        raise ToolError(
            f"The path {path} is not an absolute path, it should start with `/`. Use an absolute path: {hint}"
        )
    normalised = posixpath.normpath(path)
    if normalised.startswith("//"):  # POSIX keeps a leading "//"; it means "/" here
        normalised = "/" + normalised.lstrip("/")
    if not is_inside_workspace(normalised):
        if ".." in path.split("/"):
            raise ToolError(
                f"The path {path} escapes the workspace through `..`; only {WORKSPACE} can be used."
            )
        raise ToolError(
            f"The path {path} is outside the workspace; only paths inside {WORKSPACE} can be used."
        )
    resolved = await sandbox.realpath(normalised)
    if not is_inside_workspace(resolved):
        raise ToolError(
            f"The path {path} resolves to {resolved} through a symbolic link, which is outside the "
            f"workspace; only {WORKSPACE} can be used."
        )
    return resolved


async def path_entry(sandbox: Sandbox, real: str) -> FileEntry | None:
    """The entry of a resolved sandbox path, or None when nothing is there (or a parent is a file)."""
    try:
        return await sandbox.stat(real)
    except NotADirectoryError:
        return None


def entry_kind(entry: FileEntry | None) -> str:
    """``"dir"``, ``"file"``, ``"special"`` (a FIFO, socket or device) or ``"missing"``."""
    if entry is None:
        return "missing"
    if entry.special:
        return "special"
    return "dir" if entry.is_dir else "file"


async def path_kind(sandbox: Sandbox, real: str) -> str:
    """:func:`entry_kind` of a resolved sandbox path."""
    return entry_kind(await path_entry(sandbox, real))


def special_file_error(path: str, entry: FileEntry) -> ToolError:
    return ToolError(
        f"The path {path} is a {entry.special}, not a regular file: the tools never open one (reading it "
        "could block or never end). Use the shell if you really need it."
    )


def printable_path(path: str) -> str:
    """``path`` as shown to the model: control characters as escapes (a newline in a file name must
    not look like the next entry) and bytes that are not UTF-8 (``surrogateescape``) as ``\\xNN``."""
    if path.isprintable():
        return path
    out = []
    for ch in path:
        if ch.isprintable():
            out.append(ch)
        elif 0xDC80 <= ord(ch) <= 0xDCFF:
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)
