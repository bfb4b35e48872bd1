"""The replays ``eval --gold`` and ``--empty`` run: real turns through the real tools, no model.

The gold replay makes the task's gold patch with the editor (one ``str_replace`` per hunk, widened
by the lines around it where its text recurs in the file, or ``create`` for a new file), falling
back to the shell writing a file whole when that cannot be done; then it runs the failing tests
and finishes. The empty replay finishes at once, changing nothing. Each is a JSON Lines file the
replay backend reads.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.handback.hostgit import git

WORKSPACE = "/workspace"


@dataclass
class FileDiff:
    old: str | None  # None: the file is new
    new: str | None  # None: the file is deleted
    hunks: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (old lines, new lines)


def parse_patch(patch: str) -> list[FileDiff]:
    """The files and hunks of a unified diff (``a/`` and ``b/`` prefixes)."""
    files: list[FileDiff] = []
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FileDiff(_path(line[4:]), _path(lines[i + 1][4:])))
            i += 2
            continue
        if line.startswith("@@") and files:
            old: list[str] = []
            new: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].startswith(("@@", "--- ", "diff ")):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    pass
                elif body.startswith("-"):
                    old.append(body[1:])
                elif body.startswith("+"):
                    new.append(body[1:])
                else:
                    old.append(body[1:])
                    new.append(body[1:])
                i += 1
            files[-1].hunks.append((old, new))
            continue
        i += 1
    return files


def _path(field_text: str) -> str | None:
    name = field_text.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def _call(name: str, **args: str) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def patched_files(repo: Path, patch: str) -> dict[str, bytes | None]:
    """What ``patch`` makes of each file it touches in ``repo`` (None: deleted), by ``git apply``
    in a scratch copy; ``repo`` is left as it is."""
    scratch = Path(tempfile.mkdtemp(prefix="clover-eval-"))
    try:
        copy = scratch / "repo"
        shutil.copytree(repo, copy, symlinks=True)
        git(copy, "apply", "--whitespace=nowarn", "-", input=patch.encode())
        out: dict[str, bytes | None] = {}
        for diff in parse_patch(patch):
            for name in {diff.old, diff.new} - {None}:
                assert name is not None
                path = copy / name
                out[name] = path.read_bytes() if path.is_file() else None
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def gold_turns(repo: Path, patch: str, check: str) -> list[str]:
    """The turns that make ``patch`` in ``repo``'s workspace, run ``check`` and finish."""
    final = patched_files(repo, patch)
    turns: list[str] = []
    for diff in parse_patch(patch):
        if diff.new is None:
            assert diff.old is not None
            turns.append(_call("shell", command=f"rm -f -- {WORKSPACE}/{diff.old}"))
            continue
        target = f"{WORKSPACE}/{diff.new}"
        content = final[diff.new]
        assert content is not None
        text = content.decode("utf-8", "surrogateescape")
        if diff.old is None:
            turns.append(_call("editor", command="create", path=target, file_text=text))
            continue
        edits = _hunk_edits((repo / diff.old).read_text(encoding="utf-8"), diff, text)
        if edits is None:  # not expressible as unique replacements: write it whole
            encoded = base64.b64encode(content).decode()
            command = (
                f"python3 -c \"import base64,pathlib; pathlib.Path('{target}').write_bytes("
                f"base64.b64decode('{encoded}'))\""
            )
            turns.append(_call("shell", command=command))
        else:
            turns.append(_call("editor", command="view", path=target))
            turns += [
                _call("editor", command="str_replace", path=target, old_str=old, new_str=new)
                for old, new in edits
            ]
    turns.append(_call("run_tests", target=check))
    turns.append(_call("finish", summary="Applied the fix (the task's gold patch)."))
    return turns


def _hunk_edits(text: str, diff: FileDiff, final: str) -> list[tuple[str, str]] | None:
    """One (old, new) replacement per hunk, each old text found once in the file as it then is
    (a hunk whose text recurs, as the same change in two functions, is widened by the lines around
    it, in the file's order, until it is unique), whose result is exactly ``final``; None when that
    does not hold."""
    edits = []
    cursor = 0  # hunks come in the file's order: each is found after the one before
    for old_lines, new_lines in diff.hunks:
        old, new = "\n".join(old_lines), "\n".join(new_lines)
        at = text.find(old, cursor)
        if not old.strip() or at < 0:
            return None
        start, end = at, at + len(old)
        while text.count(text[start:end]) != 1:
            wider = (text.rfind("\n", 0, max(start - 1, 0)) + 1 if start else 0, _line_end(text, end + 1))
            if wider == (start, end):
                return None
            start, end = wider
        replaced = text[start:at] + new + text[at + len(old) : end]
        edits.append((text[start:end], replaced))
        text = text[:start] + replaced + text[end:]
        cursor = start + len(replaced)
    return edits if text == final else None


def _line_end(text: str, at: int) -> int:
    """Where the line holding ``at`` ends (the file's end when it is the last)."""
    if at > len(text):
        return len(text)
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def empty_turns() -> list[str]:
    return [_call("finish", summary="No change.")]


def write_replay(path: Path, turns: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"content": turn}) + "\n" for turn in turns), encoding="utf-8")
    return path
