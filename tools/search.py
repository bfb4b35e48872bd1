"""``search``: a regular expression over the workspace's files, as ``path:line:text`` lines.

With ripgrep (``rg``) in the sandbox it runs there; without it a small standard-library Python
script runs there instead (:data:`FALLBACK_MAX_FILE_BYTES` and the other differences are in
docs/tools.md). Either way the search runs in the sandbox under a timeout, so a pathological
pattern (``(a+)+$``) costs the sandbox's time, never the host's, and at most :data:`MAX_MATCHES`
lines are shown with the number left out stated.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from typing import Any, ClassVar

from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult
from clover_agent.tools.paths import path_entry, resolve_workspace_path, special_file_error

MAX_MATCHES = 100
MAX_LINE_CHARS = 300
FALLBACK_MAX_FILE_BYTES = 1_000_000
FALLBACK_MAX_DEPTH = 64
SEARCH_TIMEOUT_S = 120.0
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
    result = await sandbox.exec(line, timeout=SEARCH_TIMEOUT_S, cwd=folder)
    _check_timeout(result.timed_out)
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


def _check_timeout(timed_out: bool) -> None:
    if timed_out:
        raise ToolError(
            f"The search timed out after {SEARCH_TIMEOUT_S:g} s and was stopped. Narrow the path or glob, "
            "or simplify the pattern (nested repetition such as `(a+)+` can take forever)."
        )


#: The Python fallback, run in the sandbox: ``python3 -c SCRIPT PATTERN TARGET GLOB``. It prints one
#: JSON object per line: ``{"match": "rel:line:text"}`` (the first MAX), then ``{"total": N,
#: "problems": [...]}``, or ``{"error": TEXT}`` for a bad pattern.
_PY_SEARCH = r"""
import fnmatch, json, os, posixpath, re, stat, sys
pattern, target, glob = sys.argv[1], sys.argv[2], sys.argv[3]
MAX, CLIP, MAX_FILE, MAX_DEPTH = @MAX@, @CLIP@, @MAX_FILE@, @MAX_DEPTH@
try:
    regex = re.compile(pattern)
except re.error as exc:
    print(json.dumps({"error": f"Invalid regular expression {pattern!r}: {exc}"}))
    sys.exit(2)
def glob_ok(rel):
    g = glob.strip("/")
    if not g:
        return True
    if "/" not in g:
        return fnmatch.fnmatchcase(posixpath.basename(rel), g)
    return fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(rel, g.replace("**/", ""))
def files():
    if not os.path.isdir(target):
        yield target
        return
    for top, dirs, names in os.walk(target):
        depth = 0 if top == target else top[len(target):].count("/") + 1
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < MAX_DEPTH)
        for name in sorted(names):
            if not name.startswith("."):
                rel = posixpath.relpath(posixpath.join(top, name), target)
                if glob_ok(rel):
                    yield posixpath.join(top, name)
total, problems = 0, []
for path in files():
    shown = path[2:] if path.startswith("./") else path
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE:
            continue
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError as exc:
        problems.append(f"{shown}: {exc.strerror or exc}")
        continue
    if len(data) > MAX_FILE or b"\0" in data[:8192]:
        continue
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    for number, line in enumerate(text.split("\n"), start=1):
        if regex.search(line):
            total += 1
            if total <= MAX:
                line = line.rstrip("\r")
                if len(line) > CLIP:
                    line = line[:CLIP] + " [... line cut ...]"
                print(json.dumps({"match": f"{shown}:{number}:{line}"}))
print(json.dumps({"total": total, "problems": problems}))
"""


async def search_with_python(
    sandbox: Sandbox, pattern: str, real: str, is_dir: bool, glob: str | None
) -> tuple[list[str], int, list[str]]:
    """(first matching lines, total count, unreadable files) from the fallback script, run in the
    searched folder (a file's folder) like ripgrep."""
    folder = real if is_dir else posixpath.dirname(real)
    script = (
        _PY_SEARCH.replace("@MAX@", str(MAX_MATCHES))
        .replace("@CLIP@", str(MAX_LINE_CHARS))
        .replace("@MAX_FILE@", str(FALLBACK_MAX_FILE_BYTES))
        .replace("@MAX_DEPTH@", str(FALLBACK_MAX_DEPTH))
    )
    words = ["-c", script, pattern, "." if is_dir else posixpath.basename(real), glob or ""]
    command = 'py=$(command -v python3 || command -v python) && "$py" ' + shlex.join(words)
    result = await sandbox.exec(command, timeout=SEARCH_TIMEOUT_S, cwd=folder)
    _check_timeout(result.timed_out)
    matches: list[str] = []
    summary: dict[str, Any] | None = None
    for line in result.output.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if "error" in item:
            raise ToolError(str(item["error"]))
        if "match" in item:
            matches.append(f"{folder.rstrip('/')}/{item['match']}")
        elif "total" in item:
            summary = item
    if summary is None:
        raise ToolError(f"The search failed (exit code {result.exit_code}): {result.output.strip()[-2000:]}")
    problems = [f"{folder.rstrip('/')}/{p}" for p in summary.get("problems", [])]
    return matches, int(summary["total"]), problems


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
        entry = await path_entry(ctx.sandbox, real)
        if entry is None:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
        if entry.special:  # ripgrep would wait on a FIFO until the timeout
            raise special_file_error(path, entry)
        use_rg = self.use_ripgrep
        if use_rg is None:
            use_rg = await has_ripgrep(ctx.sandbox)
        engine = "ripgrep" if use_rg else "python"
        search = search_with_ripgrep if use_rg else search_with_python
        lines, total, problems = await search(ctx.sandbox, pattern, real, entry.is_dir, glob)
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
