"""Helpers about patches and the user's tree: test files, uncommitted changes, the command that
applies a kept patch by hand. (The ``fix`` workflow's patch is made and applied on the host from
bytes: :mod:`clover_agent.handback.stock`, :mod:`clover_agent.handback.apply`.)
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from clover_agent.handback.hostgit import git, z_list

_DIFF_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.MULTILINE)


def changed_files(patch: str) -> list[str]:
    """Paths a git diff's ``diff --git`` headers name (both sides of a rename), in order, without
    duplicates. Only for a diff made by trusted git with plain names: a quoted name stays quoted,
    and a hunk without a header is not seen (``fix`` never relies on it)."""
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


def _prefix(repo: Path) -> str:
    """``repo``'s path inside its work tree (``examples/calculator/``; empty at the top)."""
    result = git(repo, "rev-parse", "--show-prefix", check=False)
    return result.stdout.decode("utf-8", "surrogateescape").strip()


def hidden_work(repo: Path) -> dict[str, str]:
    """The files of ``repo`` whose changes git hides from ``status`` by the user's choice:
    ``path -> "--skip-worktree"`` or ``"--assume-unchanged"`` (``git ls-files -v``'s tags: ``S``,
    or a lower-case letter). They count as the user's own work: never overwritten."""
    result = git(repo, "ls-files", "-v", "-z", check=False)
    found = {}
    for entry in z_list(result.stdout):
        tag, _, path = entry.partition(" ")
        if tag == "S" or tag == "s":
            found[path] = "--skip-worktree"
        elif tag.islower():
            found[path] = "--assume-unchanged"
    return found


def apply_command(repo: Path, patch_file: Path) -> list[str]:
    """The ``git apply`` command for a patch made in a copy of ``repo``.

    ``repo`` may be a folder inside a larger git work tree (e.g. ``examples/calculator``): the patch's
    paths are relative to ``repo``, and ``git apply`` reads them from the work tree's top, so
    ``--directory`` puts the prefix back (without it git silently skips the files).
    """
    prefix = _prefix(repo)
    command = ["git", "-C", str(repo), "apply"]
    if prefix:
        command.append(f"--directory={prefix.rstrip('/')}")
    return [*command, str(patch_file)]
