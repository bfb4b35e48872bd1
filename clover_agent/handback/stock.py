"""What a ``fix`` run hands back, computed on the host: the patch is the difference between two
snapshots of the workspace the host took itself, not anything git printed inside the sandbox.

:class:`Stock` keeps a shadow repository (:mod:`~clover_agent.handback.shadow`) in the run
folder: :meth:`Stock.record_start` makes the workspace as the sandbox starts its ``base`` commit,
:meth:`Stock.record_end` the workspace once the agent is done its ``final`` commit and the
:class:`PatchSet`, and :meth:`Stock.make_like_final` makes a fresh sandbox exactly ``final``, so
the tests that verify the patch run on the bytes that are handed back.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.errors import RUN_ERRORS, CloverError, message_of
from clover_agent.handback.paths import needs_yes, never_handed_back
from clover_agent.handback.shadow import EXECUTABLE, REGULAR, SYMLINK, Change, ShadowRepo
from clover_agent.handback.snapshot import (
    Snapshot,
    file_bytes,
    take_snapshot,
    tracked_files,
    user_excludes,
)
from clover_agent.sandboxes.base import Put, Sandbox, TreeEntry

#: A changed file larger than this is left out of the patch.
MAX_FILE_BYTES = 32 * 1024 * 1024
#: Changed files' bytes a patch carries at most; files past it are left out.
MAX_PATCH_BYTES = 256 * 1024 * 1024
SHADOW_DIR = "shadow.git"
BASE_REF, FINAL_REF = "refs/heads/base", "refs/heads/final"


class HandBackError(CloverError):
    """The workspace could not be taken stock of or reproduced (the message says what)."""


@dataclass
class PatchSet:
    """What the run hands back: ``patch`` (bytes, for ``git apply``) from the shadow repository's
    ``base`` to ``final``, its :class:`Change` list, and what was left out of it and why."""

    shadow: ShadowRepo
    base: str
    final: str
    patch: bytes
    changes: list[Change]
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """Every path the patch touches, in order."""
        return [c.path for c in self.changes]

    @property
    def needing_yes(self) -> dict[str, str]:
        """``path -> why`` for the changes a person must say yes to by their paths' rules
        (:func:`~clover_agent.handback.paths.needs_yes`: git's files, CI, executables); ``--yes``
        alone applies the rest of the patch without them."""
        found = {c.path: needs_yes(c.path, c.new_mode) for c in self.changes}
        return {path: why for path, why in found.items() if why is not None}

    @property
    def to_confirm(self) -> list[tuple[str, list[str]]]:
        """``(path, notes)`` for every change that needs a person's yes: beyond text edits
        (symlinks, binary files, mode changes: ``--yes`` alone applies none of the patch then) or
        :attr:`needing_yes`."""
        held = self.needing_yes
        notes = [(c.path, c.notes + ([held[c.path]] if c.path in held else [])) for c in self.changes]
        return [(path, found) for path, found in notes if found]

    def to_dict(self) -> dict[str, object]:
        return {
            "files": self.files,
            "changes": [
                {
                    "path": c.path,
                    "status": c.status,
                    "mode": f"{c.new_mode:o}" if c.new_mode else None,
                    "binary": c.binary,
                    "notes": c.notes,
                }
                for c in self.changes
            ],
            "left_out": self.left_out,
            "needs_yes": self.needing_yes,
        }


@dataclass(frozen=True)
class Kept:
    """The end of an agent's work: the patch made on the host (:meth:`Stock.take`), or why the
    workspace could not be read back."""

    patch_set: PatchSet | None
    problem: str = ""


def git_mode(entry: TreeEntry) -> int:
    if entry.kind == "link":
        return SYMLINK
    return EXECUTABLE if entry.mode & 0o100 else REGULAR


def link_escapes(path: str, target: str | None) -> bool:
    """Whether a symlink at ``path`` to ``target`` points outside the repository (or into its
    ``.git``), judged on the text of the target: absolute, or climbing above the top."""
    if not target or target.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == ".." or joined.startswith("../") or joined.split("/")[0] == ".git"


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class Stock:
    """The host's record of one run's workspace; ``run_dir`` holds the
    shadow repository, ``repo`` is the user's tree (its ignore rules, its tracked files, and the
    source of the starting bytes where they are the same)."""

    def __init__(self, run_dir: Path, repo: Path) -> None:
        self.repo = repo
        self.shadow = ShadowRepo(run_dir / SHADOW_DIR)
        self.excludes = user_excludes(repo)
        self.keep = tracked_files(repo)
        self.start: Snapshot | None = None
        self.base: str | None = None
        self.end: dict[str, TreeEntry] | None = None  # the final tree (left-outs at their start)
        #: The trees of the patches made from part of the final one (:meth:`subset`), by commit.
        self._ends: dict[str, dict[str, TreeEntry]] = {}
        self._subsets = 0  # subsets made: each gets a ref of its own

    async def _snapshot(self, sandbox: Sandbox, keep: set[str]) -> Snapshot:
        with tempfile.TemporaryDirectory(prefix="clover-snapshot-") as scratch:
            try:
                return await take_snapshot(sandbox, excludes=self.excludes, keep=keep, scratch=Path(scratch))
            except OSError as exc:
                raise HandBackError(f"could not take stock of the workspace: {exc}") from exc

    async def record_start(self, sandbox: Sandbox) -> None:
        """The workspace as the sandbox starts (right after it started, before any test or agent
        ran): its files and bytes (:mod:`~clover_agent.handback.snapshot`) become the ``base``
        commit."""
        self.start = await self._snapshot(sandbox, self.keep)
        writer = self.shadow.writer(BASE_REF)
        try:
            async for entry, data in file_bytes(sandbox, list(self.start.entries.values()), repo=self.repo):
                writer.put(entry.path, git_mode(entry), data)
        except OSError as exc:
            writer.abort()
            raise HandBackError(f"could not read the workspace's starting files: {exc}") from exc
        self.base = writer.finish()

    async def record_end(self, sandbox: Sandbox, *, stop: bool = True) -> PatchSet:
        """Stop every process, read what changed, and make the patch.

        - ``stop=False``: for a look only (e.g. the TUI's ``/diff``), the processes go on; never for what
          is handed back.

        Every process in the sandbox is killed first, so a daemon cannot change the workspace while or after
        it is read. The files that differ from the start then become the ``final`` commit, and the
        :class:`PatchSet` holds the patch and its changes.

        What cannot be handed back is left out of ``final`` (the start's version stays) and named: what is
        never handed back (:func:`~clover_agent.handback.paths.never_handed_back`: ``.git``, ``.clover``,
        what the host's git ignores, names with control characters), a symlink pointing outside the
        repository, a file over :data:`MAX_FILE_BYTES` and changes past :data:`MAX_PATCH_BYTES` in all.

        Left out and named the same way: FIFOs, sockets, devices, nested repositories, unreadable entries,
        and what lies in a folder left out so (never deleted for it).
        """
        assert self.start is not None and self.base is not None, "record_start first"
        if stop:
            await sandbox.stop_processes()
        start = self.start
        now = await self._snapshot(sandbox, self.keep | set(start.entries))
        left_out = {p: why for p, why in now.left_out.items() if p not in start.left_out}
        unread = set(left_out)  # entries never read: what was there stays as it was
        changed = sorted(p for p in set(start.entries) | set(now.entries) if start.differs(p, now))
        refused = never_handed_back(self.repo, changed, excludes=self.excludes, tracked=self.keep)
        end = dict(start.entries)
        writes: list[TreeEntry] = []
        budget = MAX_PATCH_BYTES
        for path in changed:
            entry = now.entries.get(path)
            if path in refused:
                left_out[path] = refused[path]
                continue
            if entry is None:
                if path in unread:  # replaced by something that is never read
                    continue
                folder = next((f for f in _parents(path) if f in unread), None)
                if folder is not None:  # in a folder that could not be read, or became a repository
                    left_out[path] = f"in {folder}, which was left out: kept as it is in your tree"
                    continue
                end.pop(path, None)
                continue
            why = None
            if entry.kind == "link" and link_escapes(path, entry.target):
                why = f"a symlink to {entry.target}, outside the repository: never applied"
            elif entry.kind == "file" and entry.size > MAX_FILE_BYTES:
                why = f"{entry.size / 2**20:.0f} MiB, over the {MAX_FILE_BYTES // 2**20} MiB a patch may carry per file"
            elif entry.kind == "file" and entry.size > budget:
                why = f"the patch already carries {MAX_PATCH_BYTES // 2**20} MiB of changed files"
            if why is not None:
                left_out[path] = why
                continue
            budget -= entry.size
            end[path] = entry
            writes.append(entry)
        writer = self.shadow.writer(FINAL_REF, self.base)
        try:
            for path in sorted(set(start.entries) - set(end)):
                writer.delete(path)
            async for entry, data in file_bytes(sandbox, writes):
                if entry.path in end:
                    writer.put(entry.path, git_mode(entry), data)
        except OSError as exc:
            writer.abort()
            raise HandBackError(f"could not read the files the agent changed: {exc}") from exc
        final = writer.finish()
        self.end = self._ends[final] = end
        return self._patch_set(final, dict(sorted(left_out.items())))

    async def take(self, sandbox: Sandbox, patch_file: Path) -> Kept:
        """:meth:`record_end`, its patch written to ``patch_file`` (empty when the workspace could
        not be read back: the problem is then in the :class:`Kept`, nothing is raised)."""
        try:
            patch = await self.record_end(sandbox)
        except (*RUN_ERRORS, OSError) as exc:
            patch_file.write_bytes(b"")
            return Kept(None, f"the workspace could not be read back from the sandbox: {message_of(exc)}")
        patch_file.write_bytes(patch.patch)
        return Kept(patch)

    def _patch_set(self, final: str, left_out: dict[str, str]) -> PatchSet:
        """The patch from ``base`` to ``final`` (a commit of the shadow repository)."""
        assert self.base is not None
        return PatchSet(
            self.shadow,
            self.base,
            final,
            self.shadow.patch(self.base, final),
            self.shadow.changes(self.base, final),
            left_out,
        )

    def subset(self, patch: PatchSet, paths: list[str]) -> PatchSet:
        """The part of ``patch`` that changes ``paths`` (and nothing else) as a patch of its own,
        from the same start: what is applied when ``--yes`` or a person's choice leaves files out,
        so that it can be verified again before it is (:meth:`make_like_final` makes it too)."""
        assert self.end is not None and self.start is not None and self.base is not None, "record_end first"
        chosen = [c for c in patch.changes if c.path in set(paths)]
        tree = self._tree(patch.final)
        files = self.shadow.files(patch.final)
        self._subsets += 1
        writer = self.shadow.writer(f"refs/heads/subset-{self._subsets}", self.base)
        end = dict(self.start.entries)
        try:
            for change in chosen:
                if change.new_mode:
                    writer.keep(change.path, files[change.path][0], files[change.path][1])
                    end[change.path] = tree[change.path]
                else:
                    writer.delete(change.path)
                    end.pop(change.path, None)
        except BaseException:
            writer.abort()
            raise
        final = writer.finish()
        self._ends[final] = end
        return self._patch_set(final, dict(patch.left_out))

    async def make_like_final(self, sandbox: Sandbox, patch: PatchSet) -> None:
        """Make ``sandbox``'s workspace (a fresh one) exactly ``patch``'s final tree (every file
        that differs written, every extra one removed), then check it again."""
        assert self.end is not None, "record_end first"
        await self.make_like(sandbox, patch.final)

    def advance(self, patch: PatchSet) -> None:
        """``patch`` (or a :meth:`subset` of it) was applied to the user's tree: its final tree is
        the start of the next patch, so what was left out of the apply is offered again."""
        assert self.start is not None
        self.start = Snapshot(dict(self._tree(patch.final)), dict(self.start.left_out))
        self.base = patch.final
        self._ends[patch.final] = dict(self.start.entries)

    def _tree(self, commit: str) -> dict[str, TreeEntry]:
        assert self.start is not None and self.base is not None
        if commit == self.base:
            return self.start.entries
        return self._ends[commit]

    async def make_like(self, sandbox: Sandbox, commit: str) -> None:
        """Make ``sandbox``'s workspace exactly the tree of ``commit`` (the base, a final one or a
        subset's), then check it again."""
        assert self.start is not None, "record_start first"
        end = self._tree(commit)
        keep = self.keep | set(self.start.entries)
        final = Snapshot(end)
        current = await self._snapshot(sandbox, keep)
        wanted = [p for p in end if current.differs(p, final)]
        extra = sorted(p for p in current.entries if p not in end)
        files = self.shadow.files(commit)
        blobs = self.shadow.blobs({p: files[p][1] for p in wanted if files[p][0] != SYMLINK})
        puts = [Put(p, "absent") for p in extra]
        for path in wanted:
            entry = end[path]
            if entry.kind == "link":
                puts.append(Put(path, "link", target=entry.target or ""))
            else:
                puts.append(Put(path, "file", 0o755 if entry.mode & 0o100 else 0o644, blobs[path]))
        try:
            await sandbox.put(puts)
        except (OSError, ValueError) as exc:
            raise HandBackError(
                f"could not write the patched files into the verification sandbox: {exc}"
            ) from exc
        check = await self._snapshot(sandbox, keep)
        wrong = sorted(p for p in set(check.entries) | set(end) if check.differs(p, final))
        if wrong:
            raise HandBackError(
                "the verification sandbox's workspace is not the patched tree after writing it: "
                + ", ".join(wrong[:10])
            )

    def discard(self) -> None:
        """Remove the shadow repository (the patch file stays)."""
        shutil.rmtree(self.shadow.path, ignore_errors=True)
