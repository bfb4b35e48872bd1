"""``search``: a regular expression over the workspace's files, as ``path:line:text`` lines.

With ripgrep (``rg``) in the sandbox it runs there (Rust regex syntax; hidden files and what
``.gitignore`` excludes are skipped). Without it a Python fallback reads the files through the
sandbox interface (Python ``re`` syntax; hidden entries skipped, ``.gitignore`` not read; files
that are binary or over 1 MB skipped). Either way at most :data:`MAX_MATCHES` lines are shown and
the number left out is stated.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from typing import Any, ClassVar

from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult
from clover_agent.tools.paths import path_kind, resolve_workspace_path
from clover_agent.tools.textfile import decode_text, is_binary

MAX_MATCHES = 100
MAX_LINE_CHARS = 300
FALLBACK_MAX_FILE_BYTES = 1_000_000
FALLBACK_MAX_DEPTH = 64
_TOTAL_MARK = "__clover_search_total__ "
_ERROR_MARK = "__clover_search_error__ "


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [... line cut ...]"


async def search_with_ripgrep(
    sandbox: Sandbox, pattern: str, real: str, is_dir: bool, glob: str | None
) -> tuple[list[str], int, list[str]]:
    """(first matching lines, total count, problems such as unreadable files) using ``rg``.

    rg runs in the searched folder (a file's folder) so that a glob with ``/`` is relative to it.
    """
    folder = real if is_dir else posixpath.dirname(real)
    cmd = ["rg", "--line-number", "--no-heading", "--with-filename", "--color", "never", "--sort", "path"]
    cmd += ["--max-columns", str(MAX_LINE_CHARS * 2), "--max-columns-preview", "--regexp", pattern]
    if glob:
        cmd += ["--glob", glob]
    cmd += ["--", "." if is_dir else posixpath.basename(real)]
    # rg's messages go through a file so that they never mix with the matches.
    line = (
        "errors=$(mktemp) && "
        + " ".join(shlex.quote(c) for c in cmd)
        + ' 2>"$errors"'
        + f" | awk -v max={MAX_MATCHES} 'NR <= max {{ print }} END {{ print \"{_TOTAL_MARK}\" NR }}'"
        + f'; status=${{PIPESTATUS[0]}}; sed "s/^/{_ERROR_MARK}/" "$errors"; rm -f "$errors"; exit $status'
    )
    result = await sandbox.exec(line, timeout=120, cwd=folder)
    matches, errors, total = [], [], 0
    for text in result.output.splitlines():
        if text.startswith(_TOTAL_MARK):
            total = int(text[len(_TOTAL_MARK) :])
        elif text.startswith(_ERROR_MARK):
            errors.append(text[len(_ERROR_MARK) :])
        else:
            matches.append(_clip(f"{folder.rstrip('/')}/{text.removeprefix('./')}"))
    if result.exit_code not in (0, 1) and not matches:
        detail = "\n".join(errors) or result.output.strip()
        raise ToolError(f"The search failed (rg exit code {result.exit_code}): {detail[:2000]}")
    return matches, total, errors


def _glob_matches(glob: str, rel: str) -> bool:
    """ripgrep-like: a glob without ``/`` matches the file name; ``**/`` may match no folders."""
    glob = glob.strip("/")
    if "/" not in glob:
        return fnmatch.fnmatchcase(posixpath.basename(rel), glob)
    return fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(rel, glob.replace("**/", ""))


async def search_with_python(
    sandbox: Sandbox, pattern: str, real: str, is_dir: bool, glob: str | None
) -> tuple[list[str], int, list[str]]:
    """(first matching lines, total count, unreadable files) reading files through the sandbox."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"Invalid regular expression {pattern!r}: {exc}") from None
    if is_dir:
        base = real.rstrip("/") + "/"
        entries = await sandbox.list_files(real, max_depth=FALLBACK_MAX_DEPTH)
        paths = sorted(e.path for e in entries if not e.is_dir and not e.is_symlink)
    else:
        base, paths = posixpath.dirname(real) + "/", [real]
    shown: list[str] = []
    problems: list[str] = []
    total = 0
    for path in paths:
        rel = path[len(base) :]
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        if glob and not _glob_matches(glob, rel):
            continue
        try:
            data = await sandbox.read_file(path)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if len(data) > FALLBACK_MAX_FILE_BYTES or is_binary(data):
            continue
        for number, text in enumerate(decode_text(data, path).text.splitlines(), start=1):
            if regex.search(text):
                total += 1
                if len(shown) < MAX_MATCHES:
                    shown.append(_clip(f"{path}:{number}:{text}"))
    return shown, total, problems


async def has_ripgrep(sandbox: Sandbox) -> bool:
    result = await sandbox.exec("command -v rg >/dev/null", timeout=30, cwd=WORKSPACE)
    return result.exit_code == 0


class SearchTool(Tool):
    name = "search"
    description = (
        "Search the workspace's files for a regular expression; prints matching lines as `path:line:text`. "
        f"`path` limits the search to a file or directory (default /workspace); `glob` limits it to file "
        f"names matching a pattern such as `*.py` or `src/**/*.ts`. At most {MAX_MATCHES} lines are shown."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "minLength": 1,
                "description": "The regular expression to look for.",
            },
            "path": {
                "type": "string",
                "description": "Absolute file or directory to search (default /workspace).",
            },
            "glob": {"type": "string", "description": "Only files whose names match this glob, e.g. `*.py`."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def __init__(self, *, use_ripgrep: bool | None = None) -> None:
        """``use_ripgrep``: None = when ``rg`` is in the sandbox; False forces the Python fallback."""
        self.use_ripgrep = use_ripgrep

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        pattern, path, glob = args["pattern"], args.get("path") or WORKSPACE, args.get("glob")
        real = await resolve_workspace_path(ctx.sandbox, path)
        kind = await path_kind(ctx.sandbox, real)
        if kind == "missing":
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
        use_rg = self.use_ripgrep
        if use_rg is None:
            use_rg = await has_ripgrep(ctx.sandbox)
        engine = "ripgrep" if use_rg else "python"
        search = search_with_ripgrep if use_rg else search_with_python
        lines, total, problems = await search(ctx.sandbox, pattern, real, kind == "dir", glob)
        where = f"{path}" + (f" (files matching {glob})" if glob else "")
        if total == 0:
            output = f"No matches found for pattern {pattern!r} in {where}."
        else:
            output = f"Found {total} matching line{'s' if total != 1 else ''} for pattern {pattern!r} in {where}:\n"
            output += "\n".join(lines)
            if total > len(lines):
                output += f"\n[... {total - len(lines)} more matching lines omitted; narrow the pattern, path or glob ...]"
        if problems:
            output += f"\n[{len(problems)} files could not be searched: " + "; ".join(problems[:5]) + "]"
        return ToolResult(
            True,
            output,
            {
                "matches": lines,
                "total": total,
                "engine": engine,
                "path": path,
                "glob": glob,
                "problems": problems,
            },
        )
