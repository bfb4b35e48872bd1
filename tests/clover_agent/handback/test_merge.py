"""The hand-back merges the agent's change with the edits the user made since the run started, in
real git repositories: edits in other hunks (uncommitted, and committed) are both kept; where they
overlap, the user's side is kept and the agent's hunk named (or both written between conflict
markers when asked); what cannot be merged (binary, a file removed on one side) is left out and
named; a signal during a merged apply leaves the tree as it was (with the user's edits) or fully
merged; hostile merges (marker-like lines, a symlinked path) change nothing they should not."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from clover_agent.handback.apply import ApplyInterrupted, PatchNotApplied, apply_patch_set
from clover_agent.handback.merge import merge
from tests.clover_agent.fix.stocked import stocked_report
from tests.git_repos import git, make_repo

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def _repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo", {"calc.py": LINES, "other.py": "X = 1\n", "logo.bin": b"\x00\x01\x02"}
    )


async def _agent_edits(repo: Path, tmp_path: Path, command: str):
    return (await stocked_report(repo, tmp_path / "run", command)).patch_set


async def test_edits_in_other_hunks_are_merged_and_yours_survive(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(repo, tmp_path, "sed -i 's/^line 15$/line 15 (agent)/' calc.py")
    mine = LINES.replace("line 2\n", "line 2 (mine, uncommitted)\n")
    (repo / "calc.py").write_text(mine)
    applied = apply_patch_set(repo, patch)
    text = (repo / "calc.py").read_text()
    assert "line 2 (mine, uncommitted)" in text and "line 15 (agent)" in text
    assert applied.files == ["calc.py"] and applied.merged == {"calc.py": ()} and not applied.left_out
    (note,) = applied.notes()
    assert "merged with your edits" in note and "the merged file was not run" in note
    assert not list((repo / ".clover").glob("apply-*"))


async def test_a_committed_edit_since_the_start_is_merged_too(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(repo, tmp_path, "sed -i 's/^line 1$/line 1 (agent)/' calc.py")
    (repo / "calc.py").write_text(LINES.replace("line 20\n", "line 20 (committed)\n"))
    git(repo, "commit", "-qam", "mine")
    apply_patch_set(repo, patch)
    text = (repo / "calc.py").read_text()
    assert text.startswith("line 1 (agent)\n") and text.endswith("line 20 (committed)\n")


async def test_an_overlap_keeps_yours_and_names_the_agents_hunk(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(
        repo, tmp_path, "sed -i -e 's/^line 5$/line 5 (agent)/' -e 's/^line 18$/line 18 (agent)/' calc.py"
    )
    mine = LINES.replace("line 5\n", "line 5 (mine)\n")
    (repo / "calc.py").write_text(mine)
    applied = apply_patch_set(repo, patch)
    text = (repo / "calc.py").read_text()
    assert "line 5 (mine)" in text and "line 5 (agent)" not in text  # yours kept where they overlap
    assert "line 18 (agent)" in text  # the rest of the agent's change applied
    assert "<<<<<<<" not in text
    assert applied.merged == {"calc.py": ("line 5 (1 line(s) of the agent's left out)",)}
    assert "left out (yours kept)" in applied.notes()[0]


async def test_markers_when_asked(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(repo, tmp_path, "sed -i 's/^line 5$/line 5 (agent)/' calc.py")
    (repo / "calc.py").write_text(LINES.replace("line 5\n", "line 5 (mine)\n"))
    applied = apply_patch_set(repo, patch, markers=True)
    lines = (repo / "calc.py").read_text().splitlines()
    at = lines.index("<<<<<<< yours")
    assert lines[at : at + 5] == [
        "<<<<<<< yours",
        "line 5 (mine)",
        "=======",
        "line 5 (agent)",
        ">>>>>>> clover-agent",
    ]
    assert (
        applied.merged == {"calc.py": (f"line {at + 1}",)}
        and "between conflict markers" in applied.notes()[0]
    )


async def test_what_cannot_be_merged_is_left_out_and_the_rest_applied(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(
        repo, tmp_path, "printf '\\000\\377' > logo.bin && echo 'X = 2' > other.py && rm calc.py"
    )
    (repo / "logo.bin").write_bytes(b"\x00mine")
    (repo / "calc.py").write_text(LINES + "line 21 (mine)\n")  # the agent removes what you extended
    applied = apply_patch_set(repo, patch)
    assert applied.files == ["other.py"] and (repo / "other.py").read_text() == "X = 2\n"
    assert (repo / "logo.bin").read_bytes() == b"\x00mine" and (repo / "calc.py").read_text().endswith(
        "(mine)\n"
    )
    assert "binary" in applied.left_out["logo.bin"] and "not an edit (deleted)" in applied.left_out["calc.py"]
    assert any("logo.bin: not applied: " in n for n in applied.notes())


async def test_nothing_mergeable_is_refused_and_the_tree_untouched(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    patch = await _agent_edits(repo, tmp_path, "printf '\\000\\377' > logo.bin")
    (repo / "logo.bin").write_bytes(b"\x00mine")
    with pytest.raises(PatchNotApplied, match=r"logo\.bin: you changed it too, and it is binary"):
        apply_patch_set(repo, patch)
    assert (repo / "logo.bin").read_bytes() == b"\x00mine"


def test_marker_lines_in_a_file_are_text_like_any_other() -> None:
    """A file that already holds marker-like lines (a test fixture of a merge tool) merges cleanly
    where nothing overlaps, and its own markers are not counted as conflicts."""
    base = b"a\n<<<<<<< x\nb\n=======\nc\n>>>>>>> y\nd\n"
    yours = base.replace(b"a\n", b"a (mine)\n")
    theirs = base.replace(b"d\n", b"d (agent)\n")
    merged = merge(base, yours, theirs)
    assert (
        merged.data == b"a (mine)\n<<<<<<< x\nb\n=======\nc\n>>>>>>> y\nd (agent)\n" and merged.overlaps == ()
    )


def test_a_signal_during_a_merged_apply_leaves_your_edits_or_the_full_merge(tmp_path: Path) -> None:
    import asyncio

    repo = make_repo(tmp_path / "source", {f"m{i}.py": LINES for i in range(300)})
    patch = asyncio.run(
        stocked_report(repo, tmp_path / "run", "sed -i 's/^line 18$/line 18 (agent)/' m*.py")
    ).patch_set
    mine = LINES.replace("line 3\n", "line 3 (mine)\n")
    merged_text = mine.replace("line 18\n", "line 18 (agent)\n")
    seen = set()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT,)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for n, delay in enumerate((0.0, 0.05, 0.2, 0.5, 1.0)):
            user = tmp_path / f"user{n}"
            git(tmp_path, "clone", "-q", str(repo), str(user))
            for i in range(300):
                (user / f"m{i}.py").write_text(mine)  # your uncommitted edits, in every file
            timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
            try:
                timer.start()
                try:
                    apply_patch_set(user, patch)
                    timer.join()
                    time.sleep(0.1)
                    seen.add("finished first")
                except ApplyInterrupted as exc:
                    seen.add("merged" if exc.applied else "unchanged")
            except KeyboardInterrupt:
                seen.add("finished first")
            finally:
                timer.cancel()
            texts = {(user / f"m{i}.py").read_text() for i in range(300)}
            assert texts in ({mine}, {merged_text}), (n, len(texts))  # never half, never without yours
            assert not list((user / ".clover").glob("apply-*"))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert "unchanged" in seen or "merged" in seen, seen  # a signal did land inside an apply


def test_a_save_of_yours_during_the_apply_is_never_moved_aside(tmp_path: Path) -> None:
    """An editor's autosave after the checks, while the files are being put in place: the apply
    stops, puts everything back, and the saved file is as saved. (The save races the moves: tried
    a few times, the race is met at least once, and every try leaves the saved file as saved.)"""
    import asyncio

    source = make_repo(tmp_path / "source", {f"m{i:04d}.py": LINES for i in range(1000)})
    patch = asyncio.run(
        stocked_report(source, tmp_path / "run", "sed -i 's/^line 18$/line 18 (agent)/' m*.py")
    ).patch_set
    saved = LINES.replace("line 1\n", "line 1 (saved meanwhile)\n")
    stopped = 0
    for attempt in range(5):
        repo = tmp_path / f"user{attempt}"
        git(tmp_path, "clone", "-q", str(source), str(repo))
        last = repo / "m0999.py"
        stop = threading.Event()

        def autosave(repo: Path = repo, last: Path = last, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                if any((p / "journal.json").exists() for p in (repo / ".clover").glob("apply-*")):
                    last.write_text(saved)  # the moves have begun; m0999.py comes last
                    return
                time.sleep(0.0001)

        saver = threading.Thread(target=autosave)
        saver.start()
        try:
            apply_patch_set(repo, patch)
        except PatchNotApplied as exc:
            assert "m0999.py: it changed while the patch was being applied" in exc.message
            assert all((repo / f"m{i:04d}.py").read_text() == LINES for i in range(999))  # all put back
            stopped += 1
        finally:
            stop.set()
            saver.join()
        assert last.read_text() == saved  # never moved aside, whoever came first
        assert not list((repo / ".clover").glob("apply-*"))
        if stopped:
            break
    assert stopped, "the save never landed during the moves"


def test_a_crash_in_the_middle_of_a_merged_apply_loses_none_of_your_edits(tmp_path: Path) -> None:
    """SIGKILL (nothing can hold it) while the merged files are being put in place: every file in the
    tree still holds your edit (moved in merged, or not moved yet), and the staging folder's journal
    names every move, with the originals beside it."""
    import asyncio
    import json
    import subprocess
    import sys

    source = make_repo(tmp_path / "source", {f"m{i:04d}.py": LINES for i in range(600)})
    report = asyncio.run(
        stocked_report(source, tmp_path / "run", "sed -i 's/^line 18$/line 18 (agent)/' m*.py")
    )
    mine = LINES.replace("line 3\n", "line 3 (mine)\n")
    for attempt in range(3):  # the kill races the moves: a try whose apply finished first is done again
        repo = tmp_path / f"user{attempt}"
        git(tmp_path, "clone", "-q", str(source), str(repo))
        for i in range(600):
            (repo / f"m{i:04d}.py").write_text(mine)
        # the child rebuilds the same PatchSet from the run's shadow repository
        child = subprocess.Popen(
            [sys.executable, "-c", _APPLY_FROM_SHADOW, str(repo), str(report.run_dir), report.patch_set.base,
             report.patch_set.final],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            journals = list((repo / ".clover").glob("apply-*/journal.json"))
            if journals and (journals[0].parent / "old-10").exists():
                os.kill(child.pid, signal.SIGKILL)  # mid-moves: ten files placed at least, some not
                break
            time.sleep(0.0002)
        child.wait(timeout=60)
        if child.returncode == -signal.SIGKILL:
            break
        assert child.returncode == 0, child.stderr.read() if child.stderr else ""
        assert all("line 3 (mine)" in (repo / f"m{i:04d}.py").read_text() for i in range(600))
    assert child.returncode == -signal.SIGKILL, "the kill never landed during the moves"
    (journal,) = list((repo / ".clover").glob("apply-*/journal.json"))
    moves = json.loads(journal.read_text())["moves"]
    assert len(moves) == 600
    merged = 0
    for index, (path, _, _) in enumerate(moves):
        target, original = repo / path, journal.parent / f"old-{index}"
        if target.exists():
            text = target.read_text()
            assert "line 3 (mine)" in text, path  # yours, merged or not moved yet
            merged += "line 18 (agent)" in text
        else:  # the kill came between its two renames: the original waits in the staging folder
            assert original.read_text() == mine, path
    assert merged >= 10
    for old in journal.parent.glob("old-*"):  # every original moved aside: yours, whole
        assert old.read_text() == mine


_APPLY_FROM_SHADOW = """
import sys
from pathlib import Path
from clover_agent.handback.apply import apply_patch_set
from clover_agent.handback.stock import SHADOW_DIR, PatchSet
from clover_agent.handback.shadow import ShadowRepo

repo, run, base, final = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
shadow = ShadowRepo(run / SHADOW_DIR)
patch = PatchSet(shadow=shadow, base=base, final=final, changes=shadow.changes(base, final), patch=b"", left_out={})
apply_patch_set(repo, patch)
"""
