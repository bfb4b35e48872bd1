"""Workspace snapshots before mutating tool calls, and undo to any earlier turn.

A snapshot is a git commit of the whole workspace made inside the sandbox with plumbing commands
on a private index (see :func:`copy_index_command`) and kept on a private ref, so the workspace's
own index, HEAD and branches are never touched and it works the same in Docker and locally. It
costs a sandbox command only when the workspace changed: :meth:`Checkpoints.look` first compares
a fingerprint of the workspace's stat data, and :meth:`Checkpoints.before_call` runs nothing. A
resumed run makes the snapshots again from the diffs the trajectory recorded
(:meth:`Checkpoints.rebuild`). What a snapshot holds, what it leaves out and why: docs/architecture.md
("Events").
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from clover_agent.errors import CloverError
from clover_agent.sandboxes.base import WORKSPACE, ExecResult, Sandbox
from clover_agent.sandboxes.tempdir import private_temp_dir
from clover_agent.sandboxes.workspace import DIFF_COMMAND, GIT_IDENTITY, add_all_command, copy_index_command

#: Starts a script with the workspace's files as a tree (``$tree``) on a private index, and its
#: HEAD (``$parent``, empty in a repository without commits). Each process it starts costs a
#: millisecond or more, so the usual ``.git`` folder is found without git.
_WORKSPACE_TREE = """\
set -e
if [ -d .git ] && [ ! -L .git ]; then gitdir=$PWD/.git; else gitdir=$(git rev-parse --absolute-git-dir); fi
export GIT_INDEX_FILE="$gitdir/{index}"
{copy_index}
{add_all}tree=$(git write-tree)
"""

_PARENT = "parent=$(git rev-parse -q --verify HEAD || true)\n"

#: Points ``{ref}`` at ``$commit``. A new loose ref is a file holding the commit's id, written
#: here without a git process (a millisecond or more) when the run's ref folder is there (the
#: first snapshot's ``update-ref`` made it) and the repository keeps loose refs (no reftable);
#: otherwise, or when something is already at that path, ``git update-ref``.
_REF = """\
ref_file="$gitdir/"{ref}
if [ -d "${{ref_file%/*}}" ] && [ ! -L "${{ref_file%/*}}" ] && [ ! -e "$gitdir/reftable" ] && [ ! -e "$ref_file" ] && [ ! -L "$ref_file" ]; then
  printf '%s\\n' "$commit" > "$ref_file"
else
  git update-ref {ref} "$commit"
fi
"""

#: After :data:`_WORKSPACE_TREE`: when the tree differs from ``{previous}`` (``-``: always), a commit
#: of it on ``{ref}`` (its parent HEAD, none when HEAD is not a commit); prints the tree, then the
#: commit when one was made; then ``{diff}``. The private index stays (the next script copies over it).
_COMMIT = (
    """\
if [ "$tree" = {previous} ]; then echo "$tree"; exit 0; fi
commit=$(git {identity} commit-tree "$tree" -p HEAD -m {message} 2>/dev/null || git {identity} commit-tree "$tree" -m {message})
"""
    + _REF
    + """\
echo "$tree $commit"
{diff}
"""
)

#: In :data:`_COMMIT`'s ``{diff}``: the workspace's diff against ``{base}``, from the index the tree
#: was written from (what ``Sandbox.diff`` prints); exit 99 when it fails (the commit stands).
_DIFF = "{diff_command} {base} || exit 99"

_RESTORE = """\
set -e
gitdir=$(git rev-parse --absolute-git-dir)
export GIT_INDEX_FILE="$gitdir/clover-restore.index"
rm -f "$GIT_INDEX_FILE"
git read-tree {commit}
git checkout-index -a -f
git ls-files -z --others --exclude-standard | xargs -0 -r rm -f --
rm -f "$GIT_INDEX_FILE"
"""


#: After :data:`_WORKSPACE_TREE`, makes one snapshot of a resumed run again: the fresh workspace's
#: tree (its files before the resumed patch is applied) plus a recorded diff; prints "<n> <commit>",
#: or "<n> -" when the diff no longer applies.
_REBUILD_ONE = """\
git read-tree "$base"
if [ ! -s {patch} ] || git apply --cached --whitespace=nowarn {patch} 2>/dev/null; then
  tree=$(git write-tree)
  commit=$(git {identity} commit-tree "$tree" ${{parent:+-p "$parent"}} -m {message})
  git update-ref {ref} "$commit"
  echo "{n} $commit"
else
  echo "{n} -"
fi
"""


def _workspace_tree(index: str, *, copied: bool = False) -> str:
    """:data:`_WORKSPACE_TREE` on the private index ``index``; ``copied``: the runner already made
    it (:meth:`Checkpoints._private_index`), so the script does not copy it."""
    copy = "" if copied else copy_index_command('"$gitdir/index"', '"$GIT_INDEX_FILE"')
    return _WORKSPACE_TREE.format(
        index=index, copy_index=copy, add_all=add_all_command('"$GIT_INDEX_FILE.err"')
    )


#: The checkpoints' private index (in the workspace's ``.git`` folder).
CHECKPOINT_INDEX = "clover-checkpoint.index"
#: Its date when the runner copies it: second 1 of 1970, as :func:`copy_index_command` dates it.
RACY_INDEX_MTIME_NS = 1_000_000_000


class WorkspaceCheckpointError(CloverError):
    """A snapshot or restore failed (e.g. the workspace is not a git repository)."""


@dataclass(frozen=True)
class Checkpoint:
    turn: int  # the model step whose first mutating call this snapshot precedes
    ref: str
    commit: str  # empty: a snapshot of an earlier session that could not be made again (see rebuild)
    tool: str


@dataclass(frozen=True)
class Recorded:
    """A snapshot as the trajectory knows it: its step, its tool, and the workspace diff (against
    the starting commit) it held."""

    turn: int
    tool: str
    patch: str | None  # None: not known (the diff could not be read then), so it cannot be rebuilt


@dataclass(frozen=True)
class Look:
    """What :meth:`Checkpoints.look` saw: whether the workspace changed since the last look or
    snapshot, and, when it changed and the diff was asked for, the workspace's diff against the
    sandbox's starting commit (None: not read, ask :meth:`Sandbox.diff`)."""

    changed: bool
    patch: str | None = None


@dataclass(frozen=True)
class _Seen:
    """The workspace as :meth:`Checkpoints.look` last saw it: its tree and a commit holding it."""

    tree: str
    commit: str
    ref: str


class Checkpoints:
    """The snapshots of one run, oldest first."""

    def __init__(self, sandbox: Sandbox, run_id: str) -> None:
        self.sandbox = sandbox
        self.run_id = run_id
        self.taken: list[Checkpoint] = []
        self._seen: _Seen | None = None  # None: the workspace is not known (start, undo, restore)
        #: The sandbox's fingerprint of the workspace as :attr:`_seen` holds it (None: unknown).
        self._fingerprint: str | None = None
        self._looks = 0

    async def before_call(self, turn: int, tool: str) -> Checkpoint:
        """The snapshot of the workspace before a call of ``tool`` that may change it, in ``turn``:
        the commit the last :meth:`snapshot` or :meth:`look` made of it (nothing runs in the
        sandbox; several turns may share one commit), or a fresh :meth:`snapshot` when the
        workspace is not known. Each such call gets its checkpoint, so :meth:`at_turn` finds the
        state any turn began with, as when every call was snapshotted."""
        seen = self._seen
        if seen is None:
            return await self.snapshot(turn, tool)
        checkpoint = Checkpoint(turn, seen.ref, seen.commit, tool)
        self.taken.append(checkpoint)
        return checkpoint

    async def look(self, *, with_diff: bool = False) -> Look:
        """Look at the workspace after a call that may have changed it: whether it differs from what
        the last look (or snapshot) saw. A changed workspace is committed for :meth:`before_call`;
        ``with_diff``: its diff is read in the same script."""
        fingerprint = await self.sandbox.fingerprint()  # taken first: a change after it shows next time
        if fingerprint is not None and fingerprint == self._fingerprint:
            return Look(False)
        self._looks += 1
        previous = self._seen.tree if self._seen is not None else "-"
        base = self.sandbox.base_commit if with_diff else None
        seen, patch = await self._commit(
            f"refs/clover/{self.run_id}/seen-{self._looks}", "after a call", previous, diff_base=base
        )
        self._fingerprint = fingerprint
        if seen is None:  # the same tree
            return Look(False)
        self._seen = seen
        return Look(True, patch)

    async def _commit(
        self, ref: str, what: str, previous: str, *, diff_base: str | None = None
    ) -> tuple[_Seen | None, str | None]:
        """Commit the workspace on ``ref`` unless its tree is ``previous`` (then None), and with a
        ``diff_base``, the workspace's diff against it when a commit was made (None otherwise, or
        when the diff could not be read)."""
        script = _workspace_tree(CHECKPOINT_INDEX, copied=await self._private_index()) + _COMMIT.format(
            identity=GIT_IDENTITY,
            message=shlex.quote(f"clover-agent checkpoint: {what}"),
            ref=shlex.quote(ref),
            previous=shlex.quote(previous),
            diff=_DIFF.format(diff_command=DIFF_COMMAND, base=shlex.quote(diff_base)) if diff_base else "",
        )
        result = await self.sandbox.exec(script, cwd=WORKSPACE, timeout=120)
        first, _, rest = result.output.partition("\n")
        words = first.split()
        if result.exit_code not in (0, 99) or not 1 <= len(words) <= 2 or len(words[0]) < 40:
            raise WorkspaceCheckpointError(
                f"could not snapshot the workspace ({what}): {result.output.strip()}"
            )
        if len(words) == 1:
            return None, None
        patch = rest if diff_base and result.exit_code == 0 else None
        return _Seen(words[0], words[1], ref), patch

    async def _private_index(self) -> bool:
        """Have the sandbox's runner copy the workspace's index to the private one (no process
        started, where the script's ``cp`` and ``touch`` are two); False where it cannot (``.git``
        is no plain folder, a sandbox without copies): the script copies it then."""
        try:
            await self.sandbox.copy_file(
                ".git/index", f".git/{CHECKPOINT_INDEX}", mtime_ns=RACY_INDEX_MTIME_NS
            )
        except (OSError, ValueError, NotImplementedError):
            return False
        return True

    def forget_workspace(self) -> None:
        """The workspace was changed behind the checkpoints' back (undo, a restored patch): the next
        :meth:`before_call` snapshots it afresh."""
        self._seen = None
        self._fingerprint = None

    async def snapshot(self, turn: int, tool: str) -> Checkpoint:
        """Snapshot the workspace as it is now, before ``tool`` runs in ``turn``."""
        ref = f"refs/clover/{self.run_id}/turn-{turn}-{len(self.taken)}"
        fingerprint = await self.sandbox.fingerprint()
        seen, _ = await self._commit(ref, f"turn {turn}, before {tool}", "-")
        assert seen is not None  # "-" is no tree: always committed
        checkpoint = Checkpoint(turn, ref, seen.commit, tool)
        self.taken.append(checkpoint)
        self._seen, self._fingerprint = seen, fingerprint
        return checkpoint

    def at_turn(self, turn: int) -> Checkpoint | None:
        """The snapshot holding the workspace as it was when ``turn`` began.

        That is the first snapshot taken in ``turn`` or later (nothing changed the workspace between
        the start of ``turn`` and it); None when nothing was changed since ``turn`` began. It has no
        commit when it could not be made again after a resume (:meth:`rebuild`).
        """
        return next((c for c in self.taken if c.turn >= turn), None)

    def can_undo_to(self, turn: int) -> bool:
        """Whether :meth:`undo_to` ``turn`` would put a snapshot back."""
        checkpoint = self.at_turn(turn)
        return checkpoint is not None and bool(checkpoint.commit)

    async def undo_to(self, turn: int) -> Checkpoint | None:
        """Put the workspace back as it was when ``turn`` began; returns the snapshot used. That
        snapshot and the later ones are forgotten: they belong to the undone work, and the workspace
        is now what the used one holds (the next mutating call snapshots it again)."""
        checkpoint = self.at_turn(turn)
        if checkpoint is None:
            return None
        if not checkpoint.commit:
            can = sorted({c.turn for c in self.taken if c.commit})
            raise WorkspaceCheckpointError(
                f"the workspace as it was at step {checkpoint.turn} could not be rebuilt after the resume "
                f"(the working tree changed since that session, or its diff was not recorded), so step "
                f"{turn} cannot be undone"
                + (f"; undo can go back to step {', '.join(map(str, can))}" if can else "")
            )
        await self.restore(checkpoint)
        del self.taken[self.taken.index(checkpoint) :]
        self.forget_workspace()
        return checkpoint

    async def rebuild(self, recorded: Sequence[Recorded]) -> list[Checkpoint]:
        """Make an earlier session's snapshots again in this fresh sandbox (see the module
        docstring), before its workspace is restored; they come first in :attr:`taken`. Returns the
        ones that could not be made (no commit)."""
        patches = list(dict.fromkeys(r.patch for r in recorded if r.patch is not None))
        commits = await self._commit_states(patches) if patches else {}
        # an unknown state (None) or one whose patch no longer applies: no ref, no commit
        none = ("", "")
        rebuilt = [
            Checkpoint(r.turn, *(none if r.patch is None else commits.get(r.patch, none)), r.tool)
            for r in recorded
        ]
        self.taken[:0] = rebuilt
        return [c for c in rebuilt if not c.commit]

    async def _commit_states(self, patches: list[str]) -> dict[str, tuple[str, str]]:
        """(ref, commit) of the fresh workspace plus each patch; ("", "") where it does not apply."""
        async with private_temp_dir(self.sandbox) as folder:
            script = [_workspace_tree("clover-rebuild.index"), _PARENT, 'base="$tree"\n']
            for n, patch in enumerate(patches):
                path = f"{folder}/{n}.patch"
                await self.sandbox.write_file(path, patch.encode("utf-8"))
                script.append(
                    _REBUILD_ONE.format(
                        n=n,
                        patch=shlex.quote(path),
                        identity=GIT_IDENTITY,
                        message=shlex.quote(f"clover-agent checkpoint rebuilt after a resume ({n})"),
                        ref=shlex.quote(self._rebuilt_ref(n)),
                    )
                )
            script.append('rm -f "$GIT_INDEX_FILE"\n')
            result = await self.sandbox.exec("".join(script), cwd=WORKSPACE, timeout=300)
        made = dict(line.split(" ", 1) for line in result.output.splitlines() if line[:1].isdigit())
        if result.exit_code != 0 or len(made) != len(patches):
            raise WorkspaceCheckpointError(
                f"could not rebuild the resumed run's snapshots: {result.output.strip()}"
            )
        return {
            patch: ("", "") if made[str(n)] == "-" else (self._rebuilt_ref(n), made[str(n)])
            for n, patch in enumerate(patches)
        }

    def _rebuilt_ref(self, n: int) -> str:
        return f"refs/clover/{self.run_id}/resumed-{n}"

    async def restore(self, checkpoint: Checkpoint) -> None:
        result = await self.sandbox.exec(
            _RESTORE.format(commit=shlex.quote(checkpoint.commit)), cwd=WORKSPACE, timeout=120
        )
        if result.exit_code != 0:
            raise WorkspaceCheckpointError(
                f"could not restore turn {checkpoint.turn}: {result.output.strip()}"
            )


async def restore_workspace(sandbox: Sandbox, patch: str) -> None:
    """Re-apply a run's final diff to a fresh sandbox (resuming a run in a new sandbox).

    A file whose change the workspace already holds (the user applied it to the tree the sandbox
    copied) counts as restored; any other file the patch does not apply to is a
    :class:`WorkspaceCheckpointError` naming it, and then nothing is applied. The patch goes through
    a private temporary folder in the sandbox, removed afterwards.
    """
    if not patch.strip():
        return
    async with private_temp_dir(sandbox) as folder:

        async def apply(text: str, *flags: str) -> ExecResult:
            path = f"{folder}/resume.patch"
            await sandbox.write_file(path, text.encode("utf-8"))
            command = shlex.join(["git", "apply", "--whitespace=nowarn", *flags, path])
            return await sandbox.exec(command, cwd=WORKSPACE, timeout=120)

        if (await apply(patch, "--check")).exit_code == 0:
            result = await apply(patch)
        else:
            to_apply, refused = [], []
            for section in _file_sections(patch):
                if (await apply(section, "--check")).exit_code == 0:
                    to_apply.append(section)
                elif (await apply(section, "--check", "-R")).exit_code != 0:  # not already there
                    refused.append(section)
            if refused:
                names = ", ".join(_section_path(s) for s in refused)
                raise WorkspaceCheckpointError(
                    f"could not restore the workspace of the resumed run: the working tree changed {names} "
                    "since, differently"
                )
            if not to_apply:
                return  # the tree holds every change already
            result = await apply("".join(to_apply))
    if result.exit_code != 0:
        raise WorkspaceCheckpointError(
            f"could not restore the workspace of the resumed run: {result.output.strip()}"
        )


def _file_sections(patch: str) -> list[str]:
    """A git patch cut into one section per file (each from its ``diff --git`` line)."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", patch, re.MULTILINE)]
    return [patch[a:b] for a, b in zip(starts, [*starts[1:], len(patch)], strict=True)] if starts else [patch]


def _section_path(section: str) -> str:
    header = section.split("\n", 1)[0]
    match = re.match(r"diff --git a/(.*) b/", header)
    return match.group(1) if match else header
