"""Run folders: where a ``fix`` run keeps its trajectory, patch and summary, and finding one again.

By default a run lives in ``<repo>/.clover/runs/<id>/`` (git-ignored by a ``.gitignore`` the folder
holds, so the user's files are untouched); a front end may give any folder instead
(``FixRequest.run_dir``: the CI bot's output folder).

A run's records are signed with the user's key (:mod:`clover_agent.agent.records`): a folder
there that this user's clover-agent did not write (one that came with the repository, or from a
workspace) is refused by :func:`check_signed`, and ``fix --resume`` and ``runs show`` read nothing
of it.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from clover_agent.agent.records import RecordKey, state_dir
from clover_agent.agent.trajectory import TRAJECTORY_FILE
from clover_agent.errors import UsageError

RUNS_DIR = Path(".clover") / "runs"
PATCH_FILE = "patch.diff"
SUMMARY_FILE = "summary.json"
#: The files of a run folder that are read back (``fix --resume``, ``runs``), and so signed.
RECORD_FILES = (TRAJECTORY_FILE, SUMMARY_FILE, PATCH_FILE)
#: ``--resume last`` picks the newest run folder.
LATEST = "last"


def new_run_id() -> str:
    """A run id that sorts by start time: ``YYYYmmdd-HHMMSS-<6 hex>``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def runs_dir(repo: Path) -> Path:
    """``<repo>/.clover/runs`` (:func:`clover_agent.agent.records.state_dir`: never through a symlink)."""
    return state_dir(repo, RUNS_DIR.name, "run records (trajectories, patches)")


def find_run(runs: Path, ref: str, flag: str = "--resume") -> Path:
    """The run folder ``ref`` names under ``runs`` (``<repo>/.clover/runs``): a run id, or ``last``.
    ``flag`` is how the command took ``ref``, for its messages."""
    existing = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    if ref == LATEST:
        if not existing:
            raise UsageError(f"{flag} last: there are no runs under {runs}")
        return runs / existing[-1]
    if ref not in existing:
        known = f"the newest are: {', '.join(existing[-3:])}" if existing else "there are none"
        raise UsageError(f"{flag} {ref}: no such run under {runs} ({known})")
    return runs / ref


def locate_run(ref: str, repo: Path | None, flag: str = "--resume") -> tuple[Path, Path]:
    """(repository, run folder) for ``ref``: a run id or ``last`` under ``repo``'s runs, or the path of
    a run folder, whose repository is the one it lies in (``repo``, when given, must be that one).
    ``repo`` None: the current folder (for an id) or the folder's repository (for a path)."""
    if ref != LATEST and (os.sep in ref or "/" in ref):
        folder = Path(ref).resolve()
        if not folder.is_dir() or len(folder.parents) < 3 or folder.parent != folder.parents[2] / RUNS_DIR:
            raise UsageError(f"{flag} {ref}: no run folder there (<repo>/{RUNS_DIR}/<id>)")
        owner = folder.parents[2]
        if repo is not None and repo.resolve() != owner:
            raise UsageError(f"{flag} {ref} is a run of {owner}, not of --repo {repo}")
        return owner, folder
    repo = (repo or Path(".")).resolve()
    return repo, find_run(repo / RUNS_DIR, ref, flag)


def record_problem(run_dir: Path, key: RecordKey) -> str | None:
    """Why the run folder was not written by this user's clover-agent (None: it was)."""
    return key.problem(run_dir, RECORD_FILES)


def check_signed(run_dir: Path, key: RecordKey) -> None:
    """:class:`UsageError` unless the run's records are this user's clover-agent's, unchanged."""
    key.check(run_dir, RECORD_FILES, f"run {run_dir.name}")
