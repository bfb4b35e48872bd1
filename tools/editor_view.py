"""The editor's ``view``: files like ``cat -n`` and folders two levels deep, within limits.

Lines end at ``\\n`` (a CR before it belongs to the line break), as for ``cat -n``, ``grep -n`` and
tracebacks; form feeds and other Unicode line separators are ordinary characters.

Limits, checked before content moves: a file over :data:`MAX_TEXT_BYTES` is never read whole
(``view_range`` then reads just those lines in the sandbox, at most :data:`MAX_RANGE_BYTES`), a view
is cut at :data:`MAX_VIEW_CHARS` characters, and a folder view lists at most
:data:`MAX_DIR_ENTRIES` entries (past that, the first level only), saying what was left out.
"""

from __future__ import annotations

import re

from clover_agent.sandboxes.base import FileEntry, FileTooLargeError, Sandbox
from clover_agent.tools.base import ToolError, ToolResult
from clover_agent.tools.paths import printable_path
from clover_agent.tools.textfile import MAX_TEXT_BYTES, TextFile, decode_bytes, decode_text

#: A view longer than this is cut, with a note telling the model how to see the rest.
MAX_VIEW_CHARS = 40_000
#: A folder view lists at most this many entries (two levels deep, hidden ones excluded).
MAX_DIR_ENTRIES = 1_000
#: The most ``view`` with ``view_range`` reads from a file over :data:`MAX_TEXT_BYTES`.
MAX_RANGE_BYTES = 256 * 1024


def cat_n(text: str, first_line: int = 1) -> str:
    """``cat -n`` style: each line as a 6-wide right-aligned number, a tab, the line."""
    return "\n".join(f"{first_line + i:6}\t{line}" for i, line in enumerate(text.split("\n")))


def display_lines(text: str) -> list[str]:
    """The file's lines as shown to the model (split at ``\\n``, CR of CRLF dropped)."""
    lines = text.replace("\r\n", "\n").split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def lines_with_ends(text: str) -> list[str]:
    """The file's lines with their line breaks, split at ``\\n`` like :func:`display_lines`."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


async def read_text(sandbox: Sandbox, path: str, real: str) -> tuple[bytes, TextFile]:
    try:
        data = await sandbox.read_file(real, max_bytes=MAX_TEXT_BYTES)
    except FileTooLargeError as exc:
        raise ToolError(too_large_message(path, exc.size)) from None
    except OSError as exc:
        raise ToolError(f"Could not read {path}: {exc.strerror or exc}.") from None
    return data, decode_text(data, path)


async def view_dir(sandbox: Sandbox, path: str, real: str) -> ToolResult:
    """Two levels deep, hidden entries excluded; past :data:`MAX_DIR_ENTRIES` entries, the first
    level only (as much of it as fits), with a notice of what was left out."""
    listing = await sandbox.list_entries(real, 2, max_entries=MAX_DIR_ENTRIES, skip_hidden=True)
    depth = 2
    if listing.left_out or not listing.complete:
        depth = 1
        total, complete = listing.total, listing.complete
        listing = await sandbox.list_entries(real, 1, max_entries=MAX_DIR_ENTRIES, skip_hidden=True)
    base, top = real.rstrip("/"), path.rstrip("/")
    shown = []
    for entry in sorted(listing.entries, key=lambda e: e.path):
        if entry.path.startswith(base + "/"):
            rel = entry.path[len(base) + 1 :]
            shown.append(printable_path(f"{top}/{rel}") + ("/" if entry.is_dir else ""))
    listing_text, cut = cut_lines(shown, MAX_VIEW_CHARS)
    notice = ""
    if depth == 1:
        many = f"{total:,}" if complete else f"more than {total:,}"
        notice = (
            f"\n[The directory has {many} entries up to 2 levels deep, over the {MAX_DIR_ENTRIES:,} a "
            f"view lists: showing {len(shown) - cut:,} of its {listing.total:,} first-level entries"
            " (folders end with /). View a subfolder, or use the shell (find, ls) with a filter.]"
        )
    elif cut:
        notice = f"\n[... {cut:,} more entries not shown: the listing is over {MAX_VIEW_CHARS:,} characters.]"
    levels = "up to 2 levels deep" if depth == 2 else "1 level deep"
    return ToolResult(
        True,
        f"Here's the files and directories {levels} in {path}, excluding hidden items:\n"
        f"{printable_path(top or '/')}\n{listing_text}{notice}\n",
        {"path": path, "entries": shown, "depth": depth, "left_out": listing.left_out},
    )


async def view_file(
    sandbox: Sandbox, path: str, real: str, entry: FileEntry, view_range: list[int] | None
) -> ToolResult:
    if view_range is not None and len(view_range) != 2:
        raise ToolError("Invalid `view_range`. It should be a list of two integers.")
    if entry.size > MAX_TEXT_BYTES:
        if view_range is None:
            raise ToolError(
                too_large_message(path, entry.size) + " To see part of it, give `view_range`, e.g. [1, 200]."
            )
        return await view_lines(sandbox, path, real, view_range)
    _, tf = await read_text(sandbox, path, real)
    lines = display_lines(tf.text)
    first, last = 1, len(lines)
    if view_range is not None:
        first, last = check_range(view_range, len(lines))
    body = cut_view(cat_n("\n".join(lines[first - 1 : last]), first), first, f"{len(lines)}")
    return ToolResult(
        True,
        f"Here's the result of running `cat -n` on {path}:\n{body}\n",
        {"path": path, "lines": len(lines), "encoding": tf.encoding, "view_range": [first, last]},
    )


async def view_lines(sandbox: Sandbox, path: str, real: str, view_range: list[int]) -> ToolResult:
    """``view_range`` of a file too large to read whole: only those lines leave the sandbox."""
    first, last = view_range
    if first < 1 or (last != -1 and last < first):
        check_range(view_range, None)
    try:
        got = await sandbox.read_lines(real, first, last, max_bytes=MAX_RANGE_BYTES)
    except OSError as exc:
        raise ToolError(f"Could not read {path}: {exc.strerror or exc}.") from None
    if got.binary:
        raise ToolError(f"The file {path} appears to be binary; the editor only works on text files.")
    total = got.total_lines
    if total is not None:
        check_range(view_range, total)
    elif got.last < first:
        raise ToolError(
            f"Could not reach line {first} of {path}: the file ({got.size:,} bytes) is too long to "
            f"count that far. Use the shell, e.g. `sed -n '{first},{first + 99}p' {path}`."
        )
    text, encoding = decode_bytes(got.data, partial=got.truncated)
    lines = display_lines(text)
    if got.truncated:
        lines = lines[:-1] or lines  # the last line was cut by the byte limit
    of = f"{total}" if total is not None else f"more than {got.last}"
    body = cut_view(cat_n("\n".join(lines), first), first, of)
    if got.truncated and len(body) <= MAX_VIEW_CHARS:
        body += (
            f"\n[... output cut at {MAX_RANGE_BYTES:,} bytes: showing lines {first}-{first + len(lines) - 1}"
            f" of {of}. Ask for a later `view_range` to see more.]"
        )
    return ToolResult(
        True,
        f"Here's the result of running `cat -n` on {path}:\n{body}\n",
        {
            "path": path,
            "lines": total,
            "encoding": encoding,
            "view_range": [first, first + len(lines) - 1],
            "size": got.size,
        },
    )


def too_large_message(path: str, size: int) -> str:
    return (
        f"The file {path} is {size:,} bytes, over the {MAX_TEXT_BYTES:,}-byte limit for the editor. "
        "Use the shell (head, sed -n, grep -n) to work with it."
    )


def check_range(view_range: list[int], count: int | None) -> tuple[int, int]:
    """``view_range`` as (first, last) for a file of ``count`` lines (None: not known), or the
    :class:`ToolError` saying what is wrong with it."""
    first, last = view_range
    if first < 1 or (count is not None and first > count):
        known = f": {[1, count]}" if count is not None else ""
        raise ToolError(
            f"Invalid `view_range`: {view_range}. Its first element `{first}` should be within the "
            f"range of lines of the file{known}"
        )
    if last == -1:
        return first, count if count is not None else -1
    if count is not None and last > count:
        raise ToolError(
            f"Invalid `view_range`: {view_range}. Its second element `{last}` should be smaller than "
            f"the number of lines in the file: `{count}`"
        )
    if last < first:
        raise ToolError(
            f"Invalid `view_range`: {view_range}. Its second element `{last}` should be larger or "
            f"equal than its first `{first}`"
        )
    return first, last


def cut_view(body: str, first: int, of: str) -> str:
    """``body`` cut at :data:`MAX_VIEW_CHARS` on a line break, with a note saying how to see more."""
    if len(body) <= MAX_VIEW_CHARS:
        return body
    cut = body.rfind("\n", 0, MAX_VIEW_CHARS)
    if cut <= 0:  # one line longer than the whole limit
        cut = MAX_VIEW_CHARS
    shown_last = first + body.count("\n", 0, cut)
    return body[:cut] + (
        f"\n[... output cut: showing lines {first}-{shown_last} of {of}. Use `view_range` to see the "
        "rest, or the search tool to find the line numbers you need.]"
    )


def cut_lines(lines: list[str], limit: int) -> tuple[str, int]:
    """``lines`` joined, as many as fit in ``limit`` characters, and how many were left out."""
    size = 0
    for i, line in enumerate(lines):
        size += len(line) + 1
        if size > limit:
            return "\n".join(lines[:i]), len(lines) - i
    return "\n".join(lines), 0
