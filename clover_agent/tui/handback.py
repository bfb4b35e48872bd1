"""Handing the session's changes back to the user's working tree, file by file (``/apply``).

The sandbox works on a copy; nothing reaches the user's tree until they pick files and apply them.
The diffs are computed inside the sandbox between two snapshot commits (git plumbing on private
refs, where the agent cannot shape them), one section per file, and a file is written only when
the user has not touched it; what ``fix`` never hands back is never applied here either
(:func:`clover_agent.fix.handback.paths.never_handed_back`). The rules are in :class:`Handback`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.agent.checkpoints import Checkpoints
from clover_agent.errors import CloverError
from clover_agent.fix.handback.patches import apply_command, changed_files, local_changes
from clover_agent.fix.handback.paths import never_handed_back
from clover_agent.fix.handback.snapshot import tracked_files, user_excludes
from clover_agent.sandboxes.base import WORKSPACE, Sandbox


@dataclass
class FileChange:
    """One file's change since it was last handed back."""

    path: str
    patch: str  # the git diff section for this file
    status: str  # added | deleted | modified
    added: int = 0
    removed: int = 0
    applied_before: bool = False


@dataclass
class ApplyOutcome:
    applied: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # path -> why
    patch_file: Path | None = None


def _digest(path: Path) -> str | None:
    """sha256 of a file's bytes; None when there is no file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _section_stats(section: str) -> tuple[str, int, int]:
    status = "modified"
    added = removed = 0
    for line in section.splitlines():
        if line.startswith("new file mode"):
            status = "added"
        elif line.startswith("deleted file mode"):
            status = "deleted"
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return status, added, removed


class Handback:
    """The bookkeeping of what was handed back from one sandbox.

    Each file's diff (``--no-renames``: a rename is a removal and an addition, each accepted on its
    own) runs from the workspace as the session started to now for a file never applied before,
    and from the snapshot it was last applied from for one applied before, so a second ``/apply``
    after more work brings only what changed since. A file is written only when the user has not
    touched it: never applied before, it must have no uncommitted change in the working tree (as
    ``fix`` hands back); applied before, its content must be exactly what the last apply left.
    What ``fix`` never hands back (``.git``, ``.clover``, what the host's git ignores, names with
    control characters) is named, and the other files chosen go ahead. The chosen sections go
    through ``git apply --check`` first, then ``git apply``, all at once: on a refusal nothing is
    written. Each apply's patch is kept in the session folder (``apply-N.diff``)."""

    def __init__(self, sandbox: Sandbox, repo: Path, folder: Path, session_id: str) -> None:
        self.sandbox = sandbox
        self.repo = repo
        self.folder = folder
        self._snapshots = Checkpoints(sandbox, f"{session_id}/handback")
        self.base: str | None = None  # snapshot of the workspace as the session started
        self.applied_from: dict[str, str] = {}  # path -> snapshot commit it was last applied from
        self.applied_digest: dict[str, str | None] = {}  # path -> sha256 the apply left (None: removed)
        self.applies = 0

    async def start(self) -> None:
        """Snapshot the starting state (call once the sandbox started, before any change)."""
        self.base = (await self._snapshots.snapshot(0, "session start")).commit

    async def _git(self, command: str) -> str:
        result = await self.sandbox.exec(command, cwd=WORKSPACE, timeout=120)
        if result.exit_code != 0:
            raise CloverError(f"could not read the session's changes: {result.output.strip()[-500:]}")
        return result.output

    async def changes(self) -> tuple[str, list[FileChange]]:
        """A snapshot of now and the files that changed since they were last handed back."""
        if self.base is None:
            raise CloverError("the sandbox is not ready yet")
        now = (await self._snapshots.snapshot(0, "handback")).commit
        names = (await self._git(f"git diff --no-renames --name-only -z {self.base} {now}")).split("\0")
        paths = sorted({p for p in names if p} | set(self.applied_from))
        found = []
        for path in paths:
            start = self.applied_from.get(path, self.base)
            section = await self._git(
                f"git diff --binary --no-renames --full-index {start} {now} -- {shlex.quote(path)}"
            )
            if section.strip():
                status, added, removed = _section_stats(section)
                found.append(FileChange(path, section, status, added, removed, path in self.applied_from))
        return now, found

    def _refusal(self, change: FileChange) -> str | None:
        """Why ``change`` must not be written into the working tree now, if it must not."""
        if change.applied_before:
            if _digest(self.repo / change.path) != self.applied_digest.get(change.path):
                return "changed in your working tree since it was applied; commit or stash it first"
            return None
        if local_changes(self.repo, [change.path]):
            return "has uncommitted changes in your working tree; commit or stash them first"
        return None

    async def apply(self, snapshot: str, chosen: list[FileChange]) -> ApplyOutcome:
        """Apply ``chosen`` (from :meth:`changes` with that ``snapshot``) to the working tree, all
        or nothing."""
        return await asyncio.to_thread(self._apply_now, snapshot, chosen)

    def _apply_now(self, snapshot: str, chosen: list[FileChange]) -> ApplyOutcome:
        never = never_handed_back(
            self.repo,
            [c.path for c in chosen],
            excludes=user_excludes(self.repo),
            tracked=tracked_files(self.repo),
        )
        outcome = self._apply_chosen(snapshot, [c for c in chosen if c.path not in never])
        outcome.refused.update({path: f"is left out ({why})" for path, why in never.items()})
        return outcome

    def _apply_chosen(self, snapshot: str, chosen: list[FileChange]) -> ApplyOutcome:
        outcome = ApplyOutcome()
        for change in chosen:
            why = self._refusal(change)
            if why is not None:
                outcome.refused[change.path] = why
        if outcome.refused or not chosen:
            return outcome
        self.applies += 1
        patch_file = self.folder / f"apply-{self.applies}.diff"
        patch_file.write_text("".join(c.patch for c in chosen), encoding="utf-8")
        outcome.patch_file = patch_file
        command = apply_command(self.repo, patch_file)
        check = subprocess.run(
            [*command[:-1], "--check", command[-1]], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            why = check.stderr.strip() or "git apply --check failed"
            outcome.refused = {c.path: why for c in chosen}
            return outcome
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            outcome.refused = {c.path: done.stderr.strip() or "git apply failed" for c in chosen}
            return outcome
        for change in chosen:
            self.applied_from[change.path] = snapshot
            self.applied_digest[change.path] = _digest(self.repo / change.path)
            outcome.applied.append(change.path)
        return outcome


def _sections(patch: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for section in re.split(r"(?m)^(?=diff --git )", patch):
        names = changed_files(section)
        if names:
            parts[names[-1]] = section
    return parts


def files_differing(before: str, after: str) -> list[str]:
    """The files whose part of two workspace diffs differs (what an undo put back)."""
    old, new = _sections(before), _sections(after)
    return sorted(path for path in old.keys() | new.keys() if old.get(path) != new.get(path))
