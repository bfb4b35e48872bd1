"""Applying a verified patch to the user's working tree: the verified bytes, all at once.

:func:`apply_patch_set` writes the final bytes of every changed file from the shadow repository
(not by re-running ``git apply``). A file the user changed since the run started is merged with
their edits (:mod:`.merge`), never written over them; every file is staged first and renamed into
place with the termination signals held, so a signal leaves the tree either unchanged or fully
patched (:class:`ApplyInterrupted`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from clover_agent.errors import CloverError, ExitCode
from clover_agent.handback.hostgit import HostGitError
from clover_agent.handback.merge import can_merge, merge
from clover_agent.handback.shadow import EXECUTABLE, REGULAR, SYMLINK, Change
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


@dataclass(frozen=True)
class Applied:
    """What an apply wrote.

    - ``files``: the paths written (or removed).
    - ``merged``: those the user had changed since the run started, merged with their edits; each
      with the agent's hunks that overlapped an edit of theirs (left out, or between conflict
      markers when ``markers``).
    - ``left_out``: the agent's changes not written, and why (a file that cannot be merged).
    """

    files: list[str]
    merged: dict[str, tuple[str, ...]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    markers: bool = False

    def notes(self) -> list[str]:
        """What a person should know beyond the files written, one line each."""
        lines = []
        for path, overlaps in self.merged.items():
            said = f"{shown_names([path])}: merged with your edits"
            if overlaps:
                what = "between conflict markers" if self.markers else "left out (yours kept)"
                said += f"; the agent's change overlapping yours, {what}, at {', '.join(overlaps)}"
            lines.append(said + " (the verdict is the agent's version's: the merged file was not run)")
        lines += [f"{shown_names([path])}: not applied: {why}" for path, why in self.left_out.items()]
        return lines


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
    found: tuple[str, int] | None = None  # what the path must still hold when it is replaced


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


def apply_patch_set(repo: Path, patch: PatchSet, *, markers: bool = False) -> Applied:
    """Apply ``patch`` to ``repo`` all at once, never over the user's own work (see :class:`Applied`).

    - A path whose bytes (and executable bit, or absence) are what the run started from gets the
      agent's bytes: byte for byte the tree the tests verified.
    - A path the user changed since (committed or not, whatever git hides): the agent's change is
      merged into theirs (:mod:`.merge`); where they overlap the user's side is kept and the
      agent's hunk named, or with ``markers`` both are written between conflict markers. One that
      cannot be merged (binary, a symlink, removed or made on one side) is left out, named.
    - No folder on the way is a symlink and nothing leaves the repository (``..``, ``.git``).

    Raises :class:`PatchNotApplied` when a check fails or nothing is left to write (the tree is
    unchanged) and :class:`ApplyInterrupted` when a signal stops it.

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
        return Applied([])
    state = {"committed": False}
    try:
        with _unwinding_on_signals():  # a signal during the checks, too, says the tree is unchanged
            staging, plan, applied = _checked_staging(repo, patch, markers)
            targets = {c.path: repo / c.path for c in patch.changes}
            try:
                _commit(_stage(patch, targets, staging, plan), staging, state)
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
    return applied


@dataclass(frozen=True)
class _Write:
    """What one path gets: the agent's bytes (``data`` None) or merged bytes, with a git mode."""

    data: bytes | None = None
    mode: int = 0
    found: tuple[str, int] = ("", 0)  # what the path held when it was checked (blob id, git mode)
    perms: int | None = None  # the user's file's permission bits (None: no file there)


def _checked_staging(repo: Path, patch: PatchSet, markers: bool) -> tuple[Path, dict[str, _Write], Applied]:
    """Every check of :func:`apply_patch_set` (raising :class:`PatchNotApplied`) and the plan: what
    each path gets (merged where the user changed it), what is left out; the staging folder to use
    (not created yet)."""
    targets = {c.path: _check_path(repo, c.path) for c in patch.changes}
    plan: dict[str, _Write] = {}
    merged: dict[str, tuple[str, ...]] = {}
    left_out: dict[str, str] = {}
    changed = []
    for change in patch.changes:
        oid, mode = _current_id(targets[change.path])
        if oid == change.old_oid and (not change.old_mode or mode == change.old_mode):
            plan[change.path] = _Write(
                mode=change.new_mode, found=(oid, mode), perms=_perms(targets[change.path])
            )
            continue
        why = _cannot_merge(change, oid, mode)
        if why:
            left_out[change.path] = why
        else:
            changed.append((change, mode))
    if changed:
        blobs = patch.shadow.blobs(
            {f"{c.path}\0old": c.old_oid for c, _ in changed}
            | {f"{c.path}\0new": c.new_oid for c, _ in changed}
        )
        for change, mode in changed:
            base, theirs = blobs[f"{change.path}\0old"], blobs[f"{change.path}\0new"]
            yours = targets[change.path].read_bytes()
            if not can_merge(base, yours, theirs):
                left_out[change.path] = "you changed it too, and it is binary: it cannot be merged"
                continue
            try:
                result = merge(base, yours, theirs, markers=markers)
            except (ValueError, HostGitError) as exc:  # git could not merge it: yours stays
                left_out[change.path] = f"you changed it too, and the merge failed ({exc})"
                continue
            # the agent's mode when it changed it, else the user's (a chmod of theirs stays)
            kept = change.new_mode if change.new_mode != change.old_mode else mode
            found = (blob_id(yours), mode)
            write = _Write(result.data, kept, found, _perms(targets[change.path]))
            plan[change.path], merged[change.path] = write, result.overlaps
    if not plan:
        raise PatchNotApplied(
            "the patch was not applied: "
            + "; ".join(f"{shown_names([path])}: {why}" for path, why in left_out.items())
        )
    root = repo / ".clover"
    if root.is_symlink():
        raise PatchNotApplied(
            f"the patch was not applied: {root} is a symlink (the staging folder goes there)"
        )
    written = [c.path for c in patch.changes if c.path in plan]
    return root / f"apply-{secrets.token_hex(4)}", plan, Applied(written, merged, left_out, markers)


def _cannot_merge(change: Change, oid: str, mode: int) -> str:
    """Why the user's change to ``change.path`` (now ``oid``, ``mode``) and the agent's cannot be
    merged line by line ("": they can)."""
    if not change.old_mode:
        return "the agent made it, and you made a file there too"
    if oid == ZERO_OID:
        return "you removed it since the run started"
    if mode not in (REGULAR, EXECUTABLE):
        return "it is no longer a plain file in your tree"
    if change.status != "modified" or not change.new_mode:
        return f"you changed it too, and the agent's change is not an edit ({change.status})"
    if SYMLINK in (change.old_mode, change.new_mode):
        return "you changed it too, and it is a symlink"
    if change.binary:
        return "you changed it too, and it is binary: it cannot be merged"
    return ""


def _stage(patch: PatchSet, targets: dict[str, Path], staging: Path, plan: dict[str, _Write]) -> list[_Step]:
    """Write every new file and link of ``plan`` in full under ``staging`` (interruptible: nothing
    is in place yet)."""
    staging.mkdir(parents=True)
    files = patch.shadow.files(patch.final)
    changes = [c for c in patch.changes if c.path in plan]
    contents = patch.shadow.blobs(
        {c.path: c.new_oid for c in changes if c.new_mode and plan[c.path].data is None}
    )
    steps = []
    for i, change in enumerate(changes):
        write = plan[change.path]
        if not change.new_mode:
            steps.append(_Step(change.path, targets[change.path], None, found=write.found))
            continue
        new = staging / f"new-{i}"
        data = contents[change.path] if write.data is None else write.data
        if files[change.path][0] == SYMLINK:
            os.symlink(os.fsdecode(data), new)
        else:
            with new.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            new.chmod(_new_perms(write.perms, write.mode))
        steps.append(_Step(change.path, targets[change.path], new, found=write.found))
    return steps


def _perms(target: Path) -> int | None:
    """The permission bits of the user's plain file at ``target`` (None: none there)."""
    try:
        st = target.lstat()
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None


def _new_perms(perms: int | None, mode: int) -> int:
    """The permission bits of a file written with git ``mode``: a new one's from the umask; one
    replacing the user's keeps theirs (a private ``0600`` file stays private), with the executable
    bits set (where readable) or cleared as ``mode`` says. Never setuid, setgid or sticky."""
    if perms is None:
        return (0o777 if mode == EXECUTABLE else 0o666) & ~_umask()
    if mode == EXECUTABLE:
        return perms if perms & 0o100 else perms | (perms & 0o444) >> 2
    return perms & ~0o111


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
    if step.found is not None and _current_id(step.target) != step.found:
        # saved again since the check (an editor's autosave): that version must not be moved aside
        raise OSError(errno.EBUSY, "it changed while the patch was being applied")
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
