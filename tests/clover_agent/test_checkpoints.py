"""Checkpoints for real: snapshots in a sandbox's git repository, undo to any turn, the base diff intact."""

from __future__ import annotations

import asyncio
import shlex
import uuid
from pathlib import Path

import pytest

from clover_agent.agent.checkpoints import Checkpoints, restore_workspace
from clover_agent.sandboxes.factory import create_sandbox
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def sandbox(request, tmp_path: Path):
    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n", ".gitignore": "*.log\n"})
    async with create_sandbox(request.param, sandbox_spec(repo)) as box:
        yield box


async def read(box, path: str) -> str | None:
    result = await box.exec(f"cat {path} 2>/dev/null || echo MISSING", cwd="/workspace")
    text = result.output
    return None if text.strip() == "MISSING" else text


async def test_undo_to_any_turn(sandbox) -> None:
    checkpoints = Checkpoints(sandbox, "run1")
    await checkpoints.snapshot(1, "editor:create")  # turn 1: state 0
    await sandbox.write_file("/workspace/new.py", b"NEW = 1\n")
    await checkpoints.snapshot(2, "editor:str_replace")  # turn 2: new.py exists
    await sandbox.write_file("/workspace/a.py", b"A = 2\n")
    await checkpoints.snapshot(4, "shell")  # turn 4 (turn 3 changed nothing)
    await sandbox.exec("rm a.py && echo junk > debug.log && mkdir -p d && echo x > d/x.txt", cwd="/workspace")

    await checkpoints.undo_to(3)  # as turn 3 began == the turn-4 snapshot
    assert await read(sandbox, "a.py") == "A = 2\n"
    assert await read(sandbox, "d/x.txt") is None
    assert await read(sandbox, "debug.log") == "junk\n"  # ignored files are left alone

    await checkpoints.undo_to(2)
    assert await read(sandbox, "a.py") == "A = 1\n"
    assert await read(sandbox, "new.py") == "NEW = 1\n"

    restored = await checkpoints.undo_to(1)
    assert restored is not None and restored.tool == "editor:create"
    assert await read(sandbox, "new.py") is None
    assert await sandbox.diff() == ""  # back at the start; the sandbox's base diff still works

    # Snapshots live on private refs; HEAD and the branch did not move.
    refs = await sandbox.exec(
        "git for-each-ref --format='%(refname)' refs/clover; git log --oneline | wc -l", cwd="/workspace"
    )
    assert refs.output.count("refs/clover/run1/turn-") == 3
    assert await checkpoints.undo_to(5) is None  # nothing changed since turn 5 began


async def test_diff_sees_changes_made_after_a_snapshot(sandbox) -> None:
    checkpoints = Checkpoints(sandbox, "run2")
    await checkpoints.snapshot(1, "shell")
    await sandbox.write_file("/workspace/a.py", b"A = 3\n")
    diff = await sandbox.diff()
    assert "-A = 1" in diff and "+A = 3" in diff


def host_tmp_files_containing(marker: str) -> list[Path]:
    """Files directly in the host's shared /tmp that hold ``marker``."""
    found = []
    for path in Path("/tmp").iterdir():
        try:
            small_file = path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 20
            if small_file and marker.encode() in path.read_bytes():
                found.append(path)
        except OSError:
            continue  # another user's file, or gone meanwhile
    return found


async def test_resuming_applies_the_patch_through_a_private_temporary_file(sandbox, tmp_path: Path) -> None:
    """The patch never lands in a shared, predictably named place (the local sandbox's /tmp is the
    host's), and nothing of it stays behind in the sandbox's temporary folder."""
    marker = uuid.uuid4().hex
    await sandbox.write_file("/workspace/a.py", f"A = '{marker}'\n".encode())
    patch = await sandbox.diff()
    async with type(sandbox)(sandbox_spec(tmp_path / "repo")) as fresh:
        await restore_workspace(fresh, patch)
        assert await read(fresh, "a.py") == f"A = '{marker}'\n"
        assert await fresh.diff() == patch
        left = await fresh.exec(f'grep -rl {marker} "${{TMPDIR:-/tmp}}" .git || true', cwd="/workspace")
        assert left.output.strip() == ""
    assert host_tmp_files_containing(marker) == []


# In one second: write a.py, stage it (the index caches its size and times), rewrite it in place
# with content of the same size. Git's stat data has whole-second times, so the cached entry still
# matches the file; only the index file's own time (same second: "racily clean") tells git to
# compare content. Then wait a second, so a copy of the index made with a fresh time would hide it.
# A loaded machine can cross a second boundary in between, which would make the change visible by
# its time alone and test nothing: the script checks the three times and tries again until they
# share one second, and says it did.
RACY_REWRITE = """
import os, subprocess, time
for attempt in range(100):
    while time.time() % 1 > 0.3:
        time.sleep(0.01)
    with open("a.py", "w") as f:
        f.write("A = 7\\n")
    written = int(os.stat("a.py").st_mtime)
    subprocess.run(["git", "add", "a.py"], check=True)
    with open("a.py", "r+") as f:
        f.write("A = 8\\n")
    seconds = {written, int(os.stat(".git/index").st_mtime), int(os.stat("a.py").st_mtime)}
    if len(seconds) == 1:
        print("racily clean")
        break
time.sleep(1.2)
"""


async def test_a_same_size_rewrite_in_the_second_the_index_was_written_is_seen(sandbox) -> None:
    # A file staged although ignored: kept only when the snapshot starts from the workspace's index.
    staged = "echo kept > kept.log && git add -f kept.log && "
    setup = await sandbox.exec(staged + f"python3 -c {shlex.quote(RACY_REWRITE)}", cwd="/workspace")
    assert setup.exit_code == 0 and "racily clean" in setup.output, setup.output
    checkpoint = await Checkpoints(sandbox, "racy").snapshot(1, "shell")
    snapshotted = await sandbox.exec(
        f"git show {checkpoint.commit}:a.py {checkpoint.commit}:kept.log", cwd="/workspace"
    )
    assert snapshotted.output == "A = 8\nkept\n"
    diff = await sandbox.diff()
    assert "+A = 8" in diff and "+kept" in diff


async def test_a_commit_is_made_only_when_the_workspace_changed_since_the_last(sandbox) -> None:
    """The loop's use: ``before_call`` before each call that may change the workspace, ``look``
    after it. A call that changes nothing costs one look and no commit; undo still finds the state
    each turn began with."""
    checkpoints = Checkpoints(sandbox, "run2")
    first = await checkpoints.before_call(1, "shell")  # nothing known yet: a snapshot
    assert not (await checkpoints.look()).changed  # `echo` changed nothing
    second = await checkpoints.before_call(2, "shell")
    assert second.commit == first.commit  # the same state, recorded for turn 2 without a commit
    await sandbox.exec("echo 'A = 2' > a.py", cwd="/workspace")  # turn 2 changes a file
    assert (await checkpoints.look()).changed
    assert not (await checkpoints.look()).changed  # and it is as the last look saw it
    fourth = await checkpoints.before_call(4, "editor:str_replace")  # turn 3 called no such tool
    assert fourth.commit != first.commit
    await sandbox.exec("echo junk > debug.log", cwd="/workspace")  # an ignored file: no change
    assert not (await checkpoints.look()).changed
    refs = await sandbox.exec("git for-each-ref refs/clover/run2 | wc -l", cwd="/workspace")
    assert refs.output.strip() == "2"  # two commits for three checkpoints

    await checkpoints.undo_to(3)  # turn 3 began after turn 2's change
    assert await read(sandbox, "a.py") == "A = 2\n"
    await checkpoints.undo_to(2)
    assert await read(sandbox, "a.py") == "A = 1\n"
    # After an undo the workspace is not taken as known: the next call snapshots it afresh.
    again = await checkpoints.before_call(5, "shell")
    assert [c.turn for c in checkpoints.taken] == [1, 5] and again.commit != fourth.commit


class CountedExecs:
    """Counts the commands a real sandbox runs (the fingerprint is a runner request, no command)."""

    def __init__(self, sandbox) -> None:
        self.count = 0
        real = sandbox.exec

        async def exec(*args, **kwargs):
            self.count += 1
            return await real(*args, **kwargs)

        sandbox.exec = exec


async def settled(sandbox) -> str:
    """The workspace's fingerprint once nothing in it changed just now (the sandbox vouches for
    nothing within a timestamp tick of a change)."""
    for _ in range(400):
        fingerprint = await sandbox.fingerprint()
        if fingerprint is not None:
            return fingerprint
        await asyncio.sleep(0.05)
    raise AssertionError("the workspace's fingerprint never settled")


# Rewrites a.py in place with content of the same size and puts its modification time back: its
# size and mtime are as before, only its change time (which no program can set) differs.
SAME_STAT_REWRITE = (
    "python3 -c \"import os; st = os.stat('a.py'); open('a.py', 'r+').write('A = 9'); "
    "os.utime('a.py', ns=(st.st_atime_ns, st.st_mtime_ns))\""
)


async def test_a_look_after_a_call_that_changed_nothing_runs_nothing_in_the_sandbox(sandbox) -> None:
    """The look asks the sandbox's runner for a fingerprint of the workspace's stat data first:
    unchanged, no git runs; any change (an in-place rewrite with its time put back, a file written
    through the runner, what git is told to ignore) is still seen."""
    checkpoints = Checkpoints(sandbox, "fp")
    await settled(sandbox)
    await checkpoints.before_call(1, "shell")
    counted = CountedExecs(sandbox)
    assert not (await checkpoints.look()).changed  # the snapshot's own fingerprint is the same
    assert counted.count == 0

    await sandbox.exec(SAME_STAT_REWRITE, cwd="/workspace")
    await settled(sandbox)
    counted.count = 0
    look = await checkpoints.look(with_diff=True)
    assert look.changed and counted.count == 1  # one script: the commit and the diff
    assert look.patch == await sandbox.diff() and "+A = 9" in look.patch

    # A new file written by no command (as the editor writes, through the runner): seen.
    await sandbox.write_file("/workspace/late.py", b"late\n")
    await settled(sandbox)
    assert (await checkpoints.look()).changed

    # Only git's own rules change (the untracked late.py now ignored): the tree differs.
    await sandbox.exec("echo late.py >> .git/info/exclude", cwd="/workspace")
    await settled(sandbox)
    counted.count = 0
    assert (await checkpoints.look()).changed and counted.count == 1
    assert not (await checkpoints.look()).changed and counted.count == 1


async def test_a_look_right_after_a_change_goes_through_git(sandbox) -> None:
    """Within a timestamp tick of a change the fingerprint vouches for nothing, so git looks (and
    finds the change made in that very tick). The file is dated an hour ahead, so it counts as
    just changed however slowly this machine gets to the look."""
    checkpoints = Checkpoints(sandbox, "racy-fp")
    await settled(sandbox)
    await checkpoints.before_call(1, "shell")
    await sandbox.exec("echo 'A = 5' > a.py && touch -d @$(( $(date +%s) + 3600 )) a.py", cwd="/workspace")
    assert await sandbox.fingerprint() is None  # changed "just now"
    counted = CountedExecs(sandbox)
    assert (await checkpoints.look()).changed and counted.count == 1


async def test_a_git_folder_that_is_a_link_is_still_snapshotted(sandbox) -> None:
    """The runner copies the private index only through a plain ``.git`` folder; behind a link the
    script finds the folder with git and copies the index itself."""
    moved = await sandbox.exec(
        "mv .git .real-git && ln -s .real-git .git && echo .real-git >> .gitignore", cwd="/workspace"
    )
    assert moved.exit_code == 0, moved.output
    checkpoints = Checkpoints(sandbox, "linked")
    first = await checkpoints.before_call(1, "shell")
    await sandbox.exec("echo 'A = 4' > a.py", cwd="/workspace")
    assert (await checkpoints.look()).changed
    await checkpoints.undo_to(1)
    assert await read(sandbox, "a.py") == "A = 1\n" and first.commit
