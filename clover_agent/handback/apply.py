"""Applying a verified patch to the user's working tree: exactly the verified bytes, all or nothing.

:func:`apply_patch_set` writes the final bytes of every changed file from the shadow repository
(not by re-running ``git apply``), only after checking that each path still holds what the run
started from, carries no uncommitted work of the user's and leads nowhere outside the repository;
every file is staged first and renamed into place with the termination signals held, so a signal
leaves the tree either unchanged or fully patched (:class:`ApplyInterrupted`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from clover_agent.errors import CloverError, ExitCode
from clover_agent.handback.patches import hidden_work, local_changes
from clover_agent.handback.shadow import EXECUTABLE, SYMLINK
from clover_agent.handback.stock import PatchSet
from clover_agent.safe_text import shown_names

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
ZERO_OID = "0" * 40


class PatchNotApplied(CloverError):
    """The patch was kept but not applied (the user's tree is unchanged); the message says why."""


class ApplyInterrupted(CloverError):
    """A signal stopped the hand-back; ``applied`` says whether the tree is fully patched (the
    signal came during the last step) or unchanged."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str, *, applied: bool) -> None:
        super().__init__(message)
        self.applied = applied


class _Stop(BaseException):
    """SIGTERM, SIGHUP or SIGQUIT while staging: unwind, cleaning up."""


def blob_id(data: bytes) -> str:
    """Git's id of a blob holding ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _Step:
    path: str
    target: Path
    new: Path | None  # the staged file or link; None: the path is removed
    backup: Path | None = None  # where the original went (set once moved)
    removed_dir: bool = False  # an emptied folder was removed to make room
    made_dirs: tuple[Path, ...] = ()


def _check_path(repo: Path, path: str) -> Path:
    """The host path for ``path``; refuses one that leaves the repository or passes a symlink."""
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == ".git" or ".git" in parts:
        raise PatchNotApplied(
            f"the patch was not applied: it names {path!r}, which is outside the repository"
        )
    here = repo
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise PatchNotApplied(
                f"the patch was not applied: {shown_names([path])} lies in {shown_names([str(here.relative_to(repo))])}, "
                "which is a symlink in "
                "your tree (writing through it could leave the repository)"
            )
        if here.exists() and not here.is_dir():
            break  # a file where the patch needs a folder: it must be one of the changed paths
    return repo / path


def _current_id(target: Path) -> tuple[str, int]:
    """(blob id, git mode) of what the user's tree holds at ``target``; (ZERO_OID, 0) for nothing."""
    try:
        st = target.lstat()
    except FileNotFoundError:
        return ZERO_OID, 0
    except NotADirectoryError:  # a file where the patch needs a folder
        return "", -1
    if stat.S_ISLNK(st.st_mode):
        return blob_id(os.fsencode(os.readlink(target))), SYMLINK
    if stat.S_ISREG(st.st_mode):
        return blob_id(target.read_bytes()), EXECUTABLE if st.st_mode & 0o100 else 0o100644
    return "", -1  # a folder, FIFO, ...: never what a patch starts from


def apply_patch_set(repo: Path, patch: PatchSet, *, ours: frozenset[str] = frozenset()) -> list[str]:
    """Apply ``patch`` to ``repo`` all at once, never over the user's own work; returns the files changed.

    - ``ours``: paths an earlier apply of the same session wrote: their uncommitted change is that
      apply's, not the user's (their bytes are still checked to be what it left).

    Raises :class:`PatchNotApplied` when a check fails (nothing changed) and :class:`ApplyInterrupted`
    when a signal stops it.

    The checks, for every path the patch touches:

    - the user's tree holds exactly what the run started from (the blob id of its bytes, its executable
      bit, or its absence), so the result is byte for byte the tree the tests verified;
    - the user has no uncommitted change to it, so their own work is never mixed with the agent's (one
      marked ``--skip-worktree`` or ``--assume-unchanged`` counts as their work: git hides its changes);
    - no folder on the way is a symlink and nothing leaves the repository (``..``, ``.git``).

    Uncommitted changes are read by a safe host git (``git status``), file names as bytes: ``café.py``
    or a name with a tab is never missed.

    Atomic: every new file is first written in full to a staging folder (``.clover/apply-<id>``, on the
    tree's file system). Only then, with SIGINT, SIGTERM, SIGHUP and SIGQUIT held (whichever thread
    receives them), is each original moved aside and each new file renamed into place, all at once; an
    error there moves everything back.

    A signal arriving before that leaves the tree unchanged; one arriving during it takes effect once
    the tree is fully patched. Either way :class:`ApplyInterrupted` says which (exit 130). Only SIGKILL
    (or a power cut) can land in the middle; the staging folder then holds ``journal.json`` naming every
    move, and the originals.
    """
    repo = repo.resolve()
    if not patch.changes:
        return []
    state = {"committed": False}
    try:
        with _unwinding_on_signals():  # a signal during the checks, too, says the tree is unchanged
            staging = _checked_staging(repo, patch, ours)
            targets = {c.path: repo / c.path for c in patch.changes}
            try:
                _commit(_stage(patch, targets, staging), staging, state)
            except BaseException:
                if not state["committed"]:
                    with _held_signals():  # a second signal must not leave the staging folder behind
                        shutil.rmtree(staging, ignore_errors=True)
                raise
    except (KeyboardInterrupt, _Stop):
        if state["committed"]:
            raise ApplyInterrupted(
                "interrupted while the patch was being applied; it was applied in full first: your tree "
                "is fully patched",
                applied=True,
            ) from None
        raise ApplyInterrupted(
            "interrupted before the patch was applied: your tree is unchanged", applied=False
        ) from None
    return [c.path for c in patch.changes]


def _checked_staging(repo: Path, patch: PatchSet, ours: frozenset[str] = frozenset()) -> Path:
    """Every check of :func:`apply_patch_set` (raising :class:`PatchNotApplied`); the staging folder
    to use (not created yet)."""
    targets = {c.path: _check_path(repo, c.path) for c in patch.changes}
    dirty = local_changes(repo, list(targets))
    hidden = hidden_work(repo) if dirty else {}
    dirty = [p for p in dirty if p not in ours or p in hidden]
    if dirty:
        marked = [f"{p} (marked {hidden[p]})" for p in dirty if p in hidden]
        raise PatchNotApplied(
            f"the patch was not applied: you have uncommitted changes to {shown_names(dirty)}, which it also "
            "changes. Commit or stash your changes, then apply it yourself."
            + (
                f" Files git hides the changes of count as your work too: {', '.join(marked)}."
                if marked
                else ""
            )
        )
    moved = []
    for change in patch.changes:
        oid, mode = _current_id(targets[change.path])
        if oid != change.old_oid or (change.old_mode and mode != change.old_mode):
            moved.append(change.path)
    if moved:
        raise PatchNotApplied(
            "the patch was not applied: these files are not what the run started from (changed in your "
            f"tree since it began?): {shown_names(moved)}. Review the patch and apply it yourself."
        )
    root = repo / ".clover"
    if root.is_symlink():
        raise PatchNotApplied(
            f"the patch was not applied: {root} is a symlink (the staging folder goes there)"
        )
    return root / f"apply-{secrets.token_hex(4)}"


def _stage(patch: PatchSet, targets: dict[str, Path], staging: Path) -> list[_Step]:
    """Write every new file and link in full under ``staging`` (interruptible: nothing is in
    place yet)."""
    staging.mkdir(parents=True)
    files = patch.shadow.files(patch.final)
    contents = patch.shadow.blobs({c.path: c.new_oid for c in patch.changes if c.new_mode})
    steps = []
    for i, change in enumerate(patch.changes):
        if not change.new_mode:
            steps.append(_Step(change.path, targets[change.path], None))
            continue
        new = staging / f"new-{i}"
        data = contents[change.path]
        if files[change.path][0] == SYMLINK:
            os.symlink(os.fsdecode(data), new)
        else:
            with new.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            new.chmod(0o777 & ~_umask() if change.new_mode == EXECUTABLE else 0o666 & ~_umask())
        steps.append(_Step(change.path, targets[change.path], new))
    return steps


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _commit(steps: list[_Step], staging: Path, state: dict[str, bool]) -> None:
    """Move the originals aside and the new files into place with the signals held (removals
    first, so a folder emptied by them can become a file); roll back on an error. A signal held
    meanwhile is delivered once the tree is fully patched (``state["committed"]`` is then set)."""
    order = [s for s in steps if s.new is None] + [s for s in steps if s.new is not None]
    journal = staging / "journal.json"
    journal.write_text(
        json.dumps({"state": "applying", "moves": [[s.path, str(s.target), str(s.new)] for s in order]})
        + "\n"
    )
    with _held_signals():
        done: list[_Step] = []
        try:
            for i, step in enumerate(order):
                _place(step, staging / f"old-{i}")
                done.append(step)
        except OSError as exc:
            for placed in reversed(done):
                _undo(placed)
            raise PatchNotApplied(
                f"the patch was not applied: {shown_names([step.path])}: {exc.strerror or exc}; your tree is unchanged"
            ) from None
        state["committed"] = True
        _remove_emptied_folders(order)
        shutil.rmtree(staging, ignore_errors=True)  # the originals and the journal: no longer needed


def _place(step: _Step, backup: Path) -> None:
    if os.path.lexists(step.target):
        if step.target.is_dir() and not step.target.is_symlink():
            os.rmdir(step.target)  # an emptied folder that becomes a file (ENOTEMPTY otherwise)
            step.removed_dir = True
        else:
            os.rename(step.target, backup)
            step.backup = backup
    if step.new is None:
        return
    missing = []
    parent = step.target.parent
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir()
        step.made_dirs += (folder,)
    os.rename(step.new, step.target)


def _undo(step: _Step) -> None:
    with contextlib.suppress(OSError):
        if step.new is not None and os.path.lexists(step.target):
            os.rename(step.target, step.new)
        for folder in reversed(step.made_dirs):
            folder.rmdir()
        if step.removed_dir:
            step.target.mkdir()
        if step.backup is not None:
            os.rename(step.backup, step.target)


def _remove_emptied_folders(steps: list[_Step]) -> None:
    """Folders left empty by removed files go too, as ``git apply`` does."""
    for step in steps:
        if step.new is not None:
            continue
        parent = step.target.parent
        for _ in step.path.split("/")[:-1]:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


@contextlib.contextmanager
def _held_signals() -> Iterator[None]:
    """Hold the signals that would stop the process, and deliver them once the block is done.

    Python runs signal handlers in the main thread only, whichever thread the kernel gave the
    signal to, so the handlers are swapped for one that notes the signal; a mask
    (``pthread_sigmask``) would not do: it holds a signal for the calling thread only, and a
    signal the kernel gives to any other thread still interrupts the main thread mid-block. Off
    the main thread Python receives no signals, and nothing is swapped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous: dict[int, Callable[[int, FrameType | None], Any] | int] = {}

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    try:
        for held in HELD_SIGNALS:
            handler = signal.getsignal(held)
            if (
                handler is not None and handler != signal.SIG_IGN
            ):  # None: set outside Python, cannot be put back
                previous[held] = handler
                signal.signal(held, note)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)  # now its own handler runs: KeyboardInterrupt, _Stop, or the default


@contextlib.contextmanager
def _unwinding_on_signals() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGQUIT unwind (so the staging folder is removed and the state is
    said) instead of ending the process on the spot; SIGINT raises ``KeyboardInterrupt`` as always."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop()

    previous = {s: signal.signal(s, stop) for s in HELD_SIGNALS[1:] if signal.getsignal(s) != signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
