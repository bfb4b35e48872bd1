"""The files of a repository as git lists them: what a sandbox copy holds and discovery reads.

Git runs on the user's repository with its fsmonitor hook off (a repository's hook never runs on
the host); ignored files are not listed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_ls_files(repo: Path, *which: str) -> list[str] | None:
    """``git ls-files`` paths (``--cached``, ``--others``), or None when ``repo`` is not in a git
    work tree. The repository's fsmonitor hook is not run."""
    command = ["git", "-c", "core.fsmonitor=false", "-C", str(repo), "ls-files", "-z", *which]
    try:
        out = subprocess.run([*command, "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sorted({p for p in out.decode("utf-8", "surrogateescape").split("\0") if p})


def listed_files(repo: str | os.PathLike[str]) -> list[str] | None:
    """The relative paths of the files a copy of ``repo`` holds besides ``.git`` (tracked and
    untracked-but-not-ignored), or None when ``repo`` is not in a git work tree."""
    return git_ls_files(Path(repo).resolve(), "--cached", "--others")
