"""The patch an agent hands back: which files it touches, and applying it to the user's tree.

A patch is only applied with ``git apply`` after ``git apply --check`` passes, and never over
uncommitted changes to a file it touches: the user's own work is never mixed with the agent's.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clover_agent.errors import CloverError

_DIFF_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class PatchSection:
    """One file's part of a git diff: from its ``diff --git`` line to the next one."""

    path: str  # the file's path after the change (the old path for a deletion)
    text: str
    deleted: bool


def patch_sections(patch: str) -> list[PatchSection]:
    """The patch cut into its files' sections, in order (text before the first header is dropped)."""
    starts = [m.start() for m in _DIFF_HEADER.finditer(patch)]
    sections = []
    for begin, end in zip(starts, [*starts[1:], len(patch)], strict=True):
        text = patch[begin:end]
        header = _DIFF_HEADER.match(text)
        assert header is not None
        # The extended header lines come before the first hunk (or the binary note).
        head = re.split(r"^(?:@@|Binary files |GIT binary patch)", text, maxsplit=1, flags=re.MULTILINE)[0]
        deleted = re.search(r"^deleted file mode ", head, re.MULTILINE) is not None
        sections.append(PatchSection(header[1] if deleted else header[2], text, deleted))
    return sections


class PatchNotApplied(CloverError):
    """The patch was kept but not applied (conflicting local changes, or it does not apply)."""


def changed_files(patch: str) -> list[str]:
    """Paths a git diff touches (both sides of a rename), in order, without duplicates."""
    files: list[str] = []
    for old, new in _DIFF_HEADER.findall(patch):
        for path in (old, new):
            if path not in files:
                files.append(path)
    return files


def is_test_file(path: str) -> bool:
    """Whether ``path`` looks like a test (edits to tests are flagged in the summary)."""
    name = posixpath.basename(path)
    parts = path.split("/")[:-1]
    return (
        name.startswith("test_")
        or re.search(r"(_test|\.test|\.spec|Test|Tests)\.\w+$", name) is not None
        or name == "conftest.py"
        or any(part in ("tests", "test", "__tests__", "spec") for part in parts)
    )


def local_changes(repo: Path, files: list[str]) -> list[str]:
    """Which of ``files`` have uncommitted changes (or are untracked) in the user's working tree."""
    if not files:
        return []
    result = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "-z", "--untracked-files=all", "--", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    entries = iter(e for e in result.stdout.split("\0") if e)
    dirty = set()
    for entry in entries:
        dirty.add(entry[3:])
        if entry[0] in "RC":  # a rename or copy: its source path follows as its own entry
            dirty.add(next(entries, ""))
    return sorted(d for d in dirty if d)


def apply_command(repo: Path, patch_file: Path) -> list[str]:
    """The ``git apply`` command for a patch made in a copy of ``repo``.

    ``repo`` may be a folder inside a larger git work tree (e.g. ``examples/calculator``): the patch's
    paths are relative to ``repo``, and ``git apply`` reads them from the work tree's top, so
    ``--directory`` puts the prefix back (without it git silently skips the files).
    """
    prefix = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--show-prefix"], capture_output=True, text=True, check=False
    ).stdout.strip()
    command = ["git", "-C", str(repo), "apply"]
    if prefix:
        command.append(f"--directory={prefix.rstrip('/')}")
    return [*command, str(patch_file)]


def apply_patch(repo: Path, patch_file: Path) -> list[str]:
    """Apply ``patch_file`` to ``repo``'s working tree; returns the files changed.

    Raises :class:`PatchNotApplied` (the patch stays where it is) when a touched file has local
    changes or the patch does not apply cleanly.
    """
    files = changed_files(patch_file.read_text(encoding="utf-8", errors="replace"))
    command = apply_command(repo, patch_file)
    how = f"review it and apply it yourself with `{shlex.join(command)}`"
    dirty = local_changes(repo, files)
    if dirty:
        raise PatchNotApplied(
            f"the patch was not applied: you have uncommitted changes to {', '.join(dirty)}, which it also "
            f"changes. Commit or stash your changes, then {how}."
        )
    check = subprocess.run(
        [*command[:-1], "--check", command[-1]], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        raise PatchNotApplied(f"the patch does not apply to {repo}: {check.stderr.strip()}; {how}")
    subprocess.run(command, capture_output=True, text=True, check=True)
    return files
