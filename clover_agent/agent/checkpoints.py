"""Workspace snapshots before every mutating tool call, and undo to any earlier turn.

A snapshot is a git commit of the whole workspace (tracked and untracked files, ``.gitignore``
respected) made with plumbing commands on a private copy of the index (one that makes git compare
every file's content, see :func:`copy_index_command`), and kept on a private ref
``refs/clover/<run>/turn-<N>-<k>``. The workspace's own index, HEAD and branches are never touched,
so the sandbox's diff against its starting commit stays correct. It runs inside the sandbox with
its own git, so it works the same in Docker and locally.

Ignored files (build output, caches) are not part of a snapshot, and restoring leaves them alone.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from clover_agent.errors import CloverError
from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.sandboxes.tempdir import private_temp_dir
from clover_agent.sandboxes.workspace import GIT_IDENTITY, copy_index_command

_SNAPSHOT = """\
set -e
gitdir=$(git rev-parse --absolute-git-dir)
export GIT_INDEX_FILE="$gitdir/clover-checkpoint.index"
{copy_index}
git add -A .
tree=$(git write-tree)
parent=$(git rev-parse -q --verify HEAD || true)
commit=$(git {identity} commit-tree "$tree" ${{parent:+-p "$parent"}} -m {message})
git update-ref {ref} "$commit"
rm -f "$GIT_INDEX_FILE"
echo "$commit"
"""

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


class CheckpointError(CloverError):
    """A snapshot or restore failed (e.g. the workspace is not a git repository)."""


@dataclass(frozen=True)
class Checkpoint:
    turn: int  # the model step whose first mutating call this snapshot precedes
    ref: str
    commit: str
    tool: str


class Checkpoints:
    """The snapshots of one run, oldest first."""

    def __init__(self, sandbox: Sandbox, run_id: str) -> None:
        self.sandbox = sandbox
        self.run_id = run_id
        self.taken: list[Checkpoint] = []

    async def snapshot(self, turn: int, tool: str) -> Checkpoint:
        """Snapshot the workspace as it is now, before ``tool`` runs in ``turn``."""
        ref = f"refs/clover/{self.run_id}/turn-{turn}-{len(self.taken)}"
        message = f"clover-agent checkpoint: turn {turn}, before {tool}"
        script = _SNAPSHOT.format(
            identity=GIT_IDENTITY,
            message=shlex.quote(message),
            ref=shlex.quote(ref),
            copy_index=copy_index_command('"$gitdir/index"', '"$GIT_INDEX_FILE"'),
        )
        result = await self.sandbox.exec(script, cwd=WORKSPACE, timeout=120)
        commit = result.output.strip().splitlines()[-1] if result.output.strip() else ""
        if result.exit_code != 0 or len(commit) < 40:
            raise CheckpointError(f"could not snapshot the workspace before {tool}: {result.output.strip()}")
        checkpoint = Checkpoint(turn, ref, commit, tool)
        self.taken.append(checkpoint)
        return checkpoint

    def at_turn(self, turn: int) -> Checkpoint | None:
        """The snapshot holding the workspace as it was when ``turn`` began.

        That is the first snapshot taken in ``turn`` or later (nothing changed the workspace between
        the start of ``turn`` and it); None when nothing was changed since ``turn`` began.
        """
        return next((c for c in self.taken if c.turn >= turn), None)

    async def undo_to(self, turn: int) -> Checkpoint | None:
        """Put the workspace back as it was when ``turn`` began; returns the snapshot used. That
        snapshot and the later ones are forgotten: they belong to the undone work, and the workspace
        is now what the used one holds (the next mutating call snapshots it again)."""
        checkpoint = self.at_turn(turn)
        if checkpoint is None:
            return None
        await self.restore(checkpoint)
        del self.taken[self.taken.index(checkpoint) :]
        return checkpoint

    async def restore(self, checkpoint: Checkpoint) -> None:
        result = await self.sandbox.exec(
            _RESTORE.format(commit=shlex.quote(checkpoint.commit)), cwd=WORKSPACE, timeout=120
        )
        if result.exit_code != 0:
            raise CheckpointError(f"could not restore turn {checkpoint.turn}: {result.output.strip()}")


async def restore_workspace(sandbox: Sandbox, patch: str) -> None:
    """Re-apply a run's final diff to a fresh sandbox (resuming a run in a new sandbox).

    The patch goes through a private temporary folder in the sandbox, removed afterwards.
    """
    if not patch.strip():
        return
    async with private_temp_dir(sandbox) as folder:
        patch_path = f"{folder}/resume.patch"
        await sandbox.write_file(patch_path, patch.encode("utf-8"))
        result = await sandbox.exec(
            f"git apply --whitespace=nowarn {shlex.quote(patch_path)}", cwd=WORKSPACE, timeout=120
        )
    if result.exit_code != 0:
        raise CheckpointError(f"could not restore the workspace of the resumed run: {result.output.strip()}")
