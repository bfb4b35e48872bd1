"""``editor``: view, create, str_replace, insert and undo_edit files in the workspace.

Commands, parameters and messages follow the ``str_replace_editor`` tool most coding models were
trained on, so a model needs no new habits; where it differs it is safer (tabs, encodings and CRLF
kept, binary and oversized files refused, ``create`` never overwrites, a matching ladder for
``str_replace`` whose result names the rung): docs/tools.md ("How each tool behaves"). ``view``
and its limits are in :mod:`clover_agent.tools.editor_view`.
"""

from __future__ import annotations

import difflib
import errno
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from clover_agent.sandboxes.base import WORKSPACE
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult
from clover_agent.tools.editor_view import (
    MAX_DIR_ENTRIES,
    cat_n,
    display_lines,
    lines_with_ends,
    read_text,
    view_dir,
    view_file,
)
from clover_agent.tools.paths import (
    entry_kind,
    path_entry,
    resolve_workspace_path,
    special_file_error,
    workspace_relative,
)
from clover_agent.tools.textfile import MAX_TEXT_BYTES, decode_text

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
#: The commands that change files (everything but ``view``).
MUTATING_COMMANDS = frozenset(COMMANDS) - {"view"}
SNIPPET_CONTEXT_LINES = 4
RUNG_NOTES = {
    "exact": "",
    "line_endings": "Note: old_str matched only after treating LF and CRLF line breaks alike.",
    "trailing_whitespace": "Note: old_str matched only after ignoring whitespace at the ends of lines.",
}


@dataclass
class Match:
    start: int
    end: int


def _rung_patterns(old_str: str) -> Iterator[tuple[str, re.Pattern[str]]]:
    """The ladder's patterns, each compiled only when the rungs before it matched nothing."""
    yield "exact", re.compile(re.escape(old_str))
    lines = re.split(r"\r?\n", old_str)
    yield "line_endings", re.compile(r"\r?\n".join(re.escape(line) for line in lines))
    yield (
        "trailing_whitespace",
        re.compile(r"[ \t]*\r?\n".join(re.escape(line.rstrip(" \t")) for line in lines)),
    )


def find_matches(text: str, old_str: str, *, overlapping: bool) -> tuple[str, list[Match]]:
    """The deciding rung of the ladder and its matches (``("", [])`` when no rung matches)."""
    for rung, pattern in _rung_patterns(old_str):
        matches: list[Match] = []
        pos = 0
        while (m := pattern.search(text, pos)) is not None:
            matches.append(Match(m.start(), m.end()))
            pos = m.start() + 1 if overlapping else max(m.end(), m.start() + 1)
        if matches:
            return rung, matches
    return "", []


def replace_matches(text: str, matches: list[Match], replacement: str) -> str:
    """``text`` with each of ``matches`` replaced by ``replacement``."""
    pieces, pos = [], 0
    for m in matches:
        pieces += [text[pos : m.start], replacement]
        pos = m.end
    return "".join([*pieces, text[pos:]])


def insert_at(text: str, lines: list[str], line: int, inserted: str, newline: str) -> str:
    """``text`` (split into ``lines`` with their ends) with ``inserted`` after line ``line``."""
    offset = sum(len(item) for item in lines[:line])
    if line == len(lines) and lines and not lines[-1].endswith("\n"):
        inserted = newline + inserted  # the last line had no line break of its own
    elif not inserted.endswith("\n"):
        inserted += newline
    return text[:offset] + inserted + text[offset:]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def unified_diff(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a{path}", f"b{path}"
        )
    )


def edit_data(path: str, old: str | None, new: str | None, **extra: Any) -> dict[str, Any]:
    """The result data of an edit for the trajectory and the UI: both contents (None = no file) and
    the unified diff between them."""
    return {
        "path": path,
        **extra,
        "old_content": old,
        "new_content": new,
        "diff": unified_diff(path, old or "", new or ""),
    }


def _snippet(text: str, first: int, last: int) -> tuple[str, int]:
    """Lines ``first..last`` (1-based) of ``text`` widened by the context lines, and the start."""
    lines = display_lines(text)
    start = max(1, first - SNIPPET_CONTEXT_LINES)
    end = min(len(lines), last + SNIPPET_CONTEXT_LINES)
    return "\n".join(lines[start - 1 : end]), start


class EditorTool(Tool):
    name = "editor"
    description = (
        "View, create and edit files in the workspace.\n"
        "* `view` on a file prints it like `cat -n`; `view_range` [start, end] limits the lines (end -1 = "
        "to the end of the file; files over 10 MB can only be viewed with it). `view` on a directory lists "
        f"files two levels deep, hidden entries excluded, at most {MAX_DIR_ENTRIES:,} entries.\n"
        "* `create` writes a new file with `file_text`; it refuses to overwrite an existing file.\n"
        "* `str_replace` replaces `old_str` by `new_str`; `old_str` must match exactly one place in the "
        "file (include enough surrounding lines to make it unique), or set `replace_all` to replace every "
        "match.\n"
        "* `insert` inserts `new_str` after line `insert_line` (0 = at the top).\n"
        "* `undo_edit` reverts the last edit made to the file with this tool.\n"
        "Paths are absolute and inside /workspace, e.g. /workspace/src/app.py."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "enum": list(COMMANDS),
                "description": "The command to run: view, create, str_replace, insert or undo_edit.",
            },
            "path": {"type": "string", "description": "Absolute path of a file or directory in /workspace."},
            "file_text": {"type": "string", "description": "For `create`: the content of the new file."},
            "old_str": {"type": "string", "description": "For `str_replace`: the text to replace."},
            "new_str": {
                "type": "string",
                "description": "For `str_replace`: the replacement (default empty). For `insert`: the text to insert.",
            },
            "insert_line": {
                "type": "integer",
                "description": "For `insert`: insert after this line (0 = before the first line).",
            },
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "For `view` on a file: [start, end] line numbers, 1-based; end -1 = to the end.",
            },
            "replace_all": {
                "type": "boolean",
                "description": "For `str_replace`: replace every match instead of requiring exactly one.",
            },
        },
        "required": ["command", "path"],
        "additionalProperties": False,
    }

    def action(self, args: dict[str, Any]) -> str:
        command = args.get("command")
        return f"editor:{command}" if isinstance(command, str) else self.name

    def mutates(self, args: dict[str, Any]) -> bool:
        return args.get("command") in MUTATING_COMMANDS

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command, path = args["command"], args["path"]
        real = await resolve_workspace_path(ctx.sandbox, path)
        entry = await path_entry(ctx.sandbox, real)
        kind = entry_kind(entry)
        if command == "create":
            if kind != "missing":
                raise ToolError(
                    f"File already exists at: {path}. Cannot overwrite files using command `create`."
                )
            return await self._create(ctx, path, real, _required(args, "file_text", command))
        if command == "undo_edit":  # also when the file was deleted since the edit
            return await self._undo(ctx, path, real)
        if entry is None:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
        if kind == "special":
            raise special_file_error(path, entry)
        if kind == "dir":
            if command != "view":
                raise ToolError(
                    f"The path {path} is a directory and only the `view` command can be used on directories."
                )
            if args.get("view_range") is not None:
                raise ToolError(
                    "The `view_range` parameter is not allowed when `path` points to a directory."
                )
            return await view_dir(ctx.sandbox, path, real)
        if command == "view":
            return await view_file(ctx.sandbox, path, real, entry, args.get("view_range"))
        if command == "str_replace":
            old_str = _required(args, "old_str", command)
            return await self._str_replace(
                ctx, path, real, old_str, args.get("new_str", ""), bool(args.get("replace_all", False))
            )
        line = _required(args, "insert_line", command)
        return await self._insert(ctx, path, real, line, _required(args, "new_str", command))

    async def _write(
        self, ctx: ToolContext, path: str, real: str, before: bytes | None, after: bytes
    ) -> None:
        try:
            await ctx.sandbox.write_file(real, after)
        except OSError as exc:
            hint = _NO_SPACE_HINT if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
            raise ToolError(
                f"Could not write {path}: {exc.strerror or exc}. Nothing was changed.{hint}"
            ) from None
        ctx.edit_history.setdefault(real, []).append(before)

    async def _create(self, ctx: ToolContext, path: str, real: str, file_text: str) -> ToolResult:
        data = file_text.encode("utf-8")
        await self._write(ctx, path, real, None, data)
        return ToolResult(
            True,
            f"File created successfully at: {path}",
            edit_data(path, None, file_text),
        )

    async def _str_replace(
        self, ctx: ToolContext, path: str, real: str, old_str: str, new_str: str, replace_all: bool
    ) -> ToolResult:
        if old_str == "":
            raise ToolError(
                "No replacement was performed: `old_str` is empty. Give the exact text to replace, "
                "or use `insert` to add text at a line."
            )
        if new_str == old_str:
            raise ToolError("No replacement was performed. `new_str` and `old_str` must be different.")
        before, tf = await read_text(ctx.sandbox, path, real)
        text = tf.text
        rung, matches = find_matches(text, old_str, overlapping=not replace_all)
        if not matches:
            raise ToolError(
                f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}."
            )
        if len(matches) > 1 and not replace_all:
            lines = sorted({line_of(text, m.start) for m in matches})
            raise ToolError(
                f"No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines {lines}. "
                "Please ensure it is unique."
            )
        replacement = tf.with_file_newlines(new_str)
        new_text = replace_matches(text, matches, replacement)
        if new_text == text:  # e.g. a whitespace-insensitive match replaced by what was there
            raise ToolError(
                f"No replacement was performed: replacing the match of old_str in {path} by new_str "
                "leaves the file as it is. Give the text that should change."
            )
        await self._write(ctx, path, real, before, tf.encode(new_text, path))

        first_line = line_of(text, matches[0].start)
        last_match_start = matches[-1].start + sum(len(replacement) - (m.end - m.start) for m in matches[:-1])
        last_line = line_of(new_text, last_match_start) + replacement.count("\n")
        snippet, start = _snippet(new_text, first_line, last_line)
        count = f"Replaced {len(matches)} occurrences of old_str. " if replace_all else ""
        note = RUNG_NOTES[rung]
        output = (
            f"The file {path} has been edited. {count}Here's the result of running `cat -n` on a snippet of "
            f"{path}:\n{cat_n(snippet, start)}\n"
            + (f"{note}\n" if note else "")
            + "Review the changes and make sure they are as expected. Edit the file again if necessary."
        )
        return ToolResult(
            True,
            output,
            edit_data(path, text, new_text, rung=rung, replacements=len(matches)),
        )

    async def _insert(
        self, ctx: ToolContext, path: str, real: str, insert_line: int, new_str: str
    ) -> ToolResult:
        before, tf = await read_text(ctx.sandbox, path, real)
        text = tf.text
        lines = lines_with_ends(text)
        if not 0 <= insert_line <= len(lines):
            raise ToolError(
                f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of "
                f"the file: {[0, len(lines)]}"
            )
        new_text = insert_at(text, lines, insert_line, tf.with_file_newlines(new_str), tf.newline)
        await self._write(ctx, path, real, before, tf.encode(new_text, path))

        added = max(1, len(new_str.splitlines()))
        snippet, start = _snippet(new_text, insert_line + 1, insert_line + added)
        output = (
            f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of the "
            f"edited file:\n{cat_n(snippet, start)}\n"
            "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
            "etc). Edit the file again if necessary."
        )
        return ToolResult(True, output, edit_data(path, text, new_text))

    async def _undo(self, ctx: ToolContext, path: str, real: str) -> ToolResult:
        history = ctx.edit_history.get(real)
        if not history:
            raise ToolError(f"No edit history found for {path}.")
        try:
            current_text = decode_text(await ctx.sandbox.read_file(real, max_bytes=MAX_TEXT_BYTES), path).text
        except (FileNotFoundError, NotADirectoryError):  # deleted, or a folder on its path is now a file
            current_text = ""
        except (OSError, ToolError):  # now a FIFO, binary or huge: the undo still restores it
            current_text = ""
        previous = history.pop()
        if previous is None:
            rel = workspace_relative(real)
            result = await ctx.sandbox.exec(f"rm -f -- {shlex.quote(rel)}", cwd=WORKSPACE)
            if result.exit_code != 0:
                history.append(previous)
                raise ToolError(f"Could not undo the creation of {path}: {result.output.strip()}")
            return ToolResult(
                True,
                f"Last edit to {path} undone successfully. The file was created by that edit and has been removed.",
                edit_data(path, current_text, None),
            )
        try:
            await ctx.sandbox.write_file(real, previous)
        except OSError as exc:
            history.append(previous)
            raise ToolError(
                f"Could not undo the last edit to {path}: {exc.strerror or exc}. Nothing was changed."
            ) from None
        previous_text = decode_text(previous, path).text
        body = cat_n("\n".join(display_lines(previous_text)))
        return ToolResult(
            True,
            f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on {path}:\n{body}\n",
            edit_data(path, current_text, previous_text),
        )


_NO_SPACE_HINT = (
    " The workspace is out of space: delete files you do not need (build output, caches, large "
    "generated files) and try again."
)


def _required(args: dict[str, Any], name: str, command: str) -> Any:
    if args.get(name) is None:
        raise ToolError(f"Parameter `{name}` is required for command: {command}")
    return args[name]
