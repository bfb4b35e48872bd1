"""Real git repositories for the tests: :func:`git` runs one git command in a repository (with a
fixed identity, so commits need no global git config) and :func:`make_repo` writes files and commits
them."""

from __future__ import annotations

import subprocess
from pathlib import Path

IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@example.com")


def git(repo: Path, *args: str) -> str:
    """The output of ``git args...`` run in ``repo``; a failing command raises."""
    return subprocess.run(
        ["git", *IDENTITY, "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(root: Path, files: dict[str, str | bytes]) -> Path:
    """A git repository at ``root`` (branch ``main``) with ``files`` committed."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root
