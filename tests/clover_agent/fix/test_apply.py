"""Applying a verified patch to the user's tree: the verified bytes, all or nothing, whatever signal
arrives, never through a symlink, never over the user's own changes.

Real repositories, a real local sandbox for the patch (:func:`stocked_report`), real signals sent
to this process while the apply runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from clover_agent.fix import decision
from clover_agent.fix.decision import YES, hand_back
from clover_agent.handback.apply import ApplyInterrupted, PatchNotApplied, apply_patch_set
from clover_agent.handback.snapshot import left_out_lines
from tests.clover_agent.fix.stocked import stocked_report
from tests.git_repos import git, make_repo

pytestmark = pytest.mark.slow

FILES = 800


def big_repo(root: Path) -> Path:
    """A repository of :data:`FILES` files of 4 KiB each, in folders."""
    return make_repo(
        root, {f"pkg{i % 30}/mod{i}.py": f"VALUE = {i}\n" + "# filler\n" * 450 for i in range(FILES)}
    )


#: Changes every file, deletes some, adds some (in a new folder), makes one executable.
BIG_EDIT = (
    "for f in pkg*/mod*.py; do echo 'CHANGED = True' >> \"$f\"; done && rm pkg0/mod0.py pkg1/mod1.py "
    "&& mkdir -p fresh/deep && for i in 1 2 3; do echo new > fresh/deep/new$i.py; done && chmod +x pkg2/mod2.py"
)


@pytest.fixture
def cli_signals():
    """The signal handlers `clover-agent fix` hands back under: Python's own (the hand-back runs
    after the event loop, whose runner would turn a first SIGINT into a task cancellation), so
    these tests do not depend on what an earlier test left installed. SIGTERM raises like SIGINT
    instead of ending the process (SIG_DFL): the apply puts its own SIGTERM handler in while it
    runs, whatever was there, so nothing changes inside it, but a SIGTERM that comes late (the
    sender saw the moves begin, then waited for a CPU) would otherwise end the test process."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def snapshot(repo: Path) -> dict[str, tuple[bytes, bool]]:
    found = {}
    for path in repo.rglob("*"):
        rel = path.relative_to(repo).as_posix()
        if path.is_file() and not rel.startswith((".git/", ".clover/")):
            found[rel] = (path.read_bytes(), bool(path.stat().st_mode & 0o100))
    return found


def expected_after(patch_report, before: dict) -> dict:
    after = dict(before)
    changes = patch_report.patch_set.changes
    blobs = patch_report.patch_set.shadow.blobs(
        {c.path: c.new_oid for c in changes if c.new_mode}
    )  # one read
    for change in changes:
        if change.new_mode:
            after[change.path] = (blobs[change.path], change.new_mode == 0o100755)
        else:
            after.pop(change.path, None)
    return after


def test_sigint_at_any_point_of_a_large_apply_leaves_the_tree_unchanged_or_fully_patched(
    tmp_path: Path, cli_signals: None
) -> None:
    """Before: Ctrl-C during `git apply` of a large patch left the tree half-patched (files
    deleted), with no word on what happened. Here SIGINT (and SIGTERM) reach this very process at
    several moments of the apply; each time the tree is exactly one of the two states, and the
    error says which."""
    source = big_repo(tmp_path / "source")
    report = asyncio.run(stocked_report(source, tmp_path / "run", BIG_EDIT))
    assert len(report.patch_set.changes) == FILES + 3
    before = snapshot(source)
    after = expected_after(report, before)
    # How long a whole apply takes here (a clone, applied without interruption).
    clone = tmp_path / "timing"
    git(tmp_path, "clone", "-q", str(source), str(clone))
    started = time.monotonic()
    apply_patch_set(clone, report.patch_set)
    whole = time.monotonic() - started
    assert snapshot(clone) == after

    seen: dict[str, int] = {"unchanged": 0, "fully patched": 0, "finished first": 0}
    delays = [whole * f for f in (0.05, 0.2, 0.4, 0.6, 0.8, 0.95, 0.99)]
    for n, (delay, signum) in enumerate(
        [(d, signal.SIGINT) for d in delays] + [(whole * 0.5, signal.SIGTERM)]
    ):
        repo = tmp_path / f"user{n}"
        git(tmp_path, "clone", "-q", str(source), str(repo))
        timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
        try:
            timer.start()
            try:
                apply_patch_set(repo, report.patch_set)
                timer.join()  # the signal may still come: let it, then see the state
                time.sleep(0.1)
                seen["finished first"] += 1
                assert snapshot(repo) == after
            except ApplyInterrupted as exc:
                state = snapshot(repo)
                if exc.applied:
                    seen["fully patched"] += 1
                    assert state == after and "fully patched" in exc.message
                else:
                    seen["unchanged"] += 1
                    assert state == before and "your tree is unchanged" in exc.message
        except KeyboardInterrupt:  # delivered after the apply returned
            seen["finished first"] += 1
            assert snapshot(repo) == after
        finally:
            timer.cancel()
        assert not list((repo / ".clover").glob("apply-*")), (n, seen)  # no staging folder left behind
    assert seen["unchanged"] >= 1, seen  # the early signals did land inside the apply


def test_a_signal_that_another_thread_receives_during_the_moves_waits_for_the_full_patch(
    tmp_path: Path, cli_signals: None
) -> None:
    """Before: the moves held the signals with ``pthread_sigmask``, which holds them for the main
    thread only. A signal the kernel gave to another thread (here the one that sends it, as with a
    Ctrl-C reaching a process that runs worker threads) still raised ``KeyboardInterrupt`` in the
    main thread in the middle of the moves: the staging folder, with the originals moved aside,
    was removed and the tree left half-patched (CI saw it once under load). The sender here waits
    until the moves have begun (the first original is in the staging folder), so its signal lands
    during them or after."""
    source = big_repo(tmp_path / "source")
    report = asyncio.run(stocked_report(source, tmp_path / "run", BIG_EDIT))
    before = snapshot(source)
    after = expected_after(report, before)
    outcomes = []
    for n, signum in enumerate([signal.SIGINT, signal.SIGTERM, signal.SIGINT]):
        repo = tmp_path / f"user{n}"
        git(tmp_path, "clone", "-q", str(source), str(repo))
        stop = threading.Event()

        def send_when_moving(repo: Path = repo, signum: int = signum, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                if any(p.joinpath("old-0").exists() for p in (repo / ".clover").glob("apply-*")):
                    os.kill(os.getpid(), signum)
                    return
                time.sleep(0.0002)

        sender = threading.Thread(target=send_when_moving)
        try:
            sender.start()
            try:
                apply_patch_set(repo, report.patch_set)
                stop.set()
                sender.join()
                time.sleep(0.1)  # a signal sent after the apply returned lands here
                outcomes.append("finished first")
            except ApplyInterrupted as exc:
                outcomes.append("fully patched" if exc.applied else "unchanged")
                assert snapshot(repo) == (after if exc.applied else before), (n, exc.message)
        except KeyboardInterrupt:
            outcomes.append("finished first")
        finally:
            stop.set()
            sender.join()
        assert snapshot(repo) == after or outcomes[-1] == "unchanged", (n, outcomes)
        assert not list((repo / ".clover").glob("apply-*")), (n, outcomes)
    assert "fully patched" in outcomes, outcomes  # the signals did land during the moves


async def test_refusals_leave_the_tree_untouched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n", "sub/b.py": "B = 1\n", "c.py": "C = 1\n"})
    report = await stocked_report(repo, tmp_path / "run", "echo 'A = 2' > a.py && echo 'B = 2' > sub/b.py")
    patch = report.patch_set
    assert patch.files == ["a.py", "sub/b.py"]

    # A folder on the way that is a symlink (writing through it would leave the repository).
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("B = 1\n")
    (repo / "sub" / "b.py").unlink()
    (repo / "sub").rmdir()
    (repo / "sub").symlink_to(outside)
    with pytest.raises(PatchNotApplied, match="symlink"):
        apply_patch_set(repo, patch)
    assert (outside / "b.py").read_text() == "B = 1\n" and (repo / "a.py").read_text() == "A = 1\n"
    (repo / "sub").unlink()
    git(repo, "checkout", "-q", "--", "sub")

    # Untracked work at the only path the patch creates: nothing can be written, nothing is.
    report2 = await stocked_report(repo, tmp_path / "run2", "echo new > new.py")
    (repo / "new.py").write_text("mine\n")
    with pytest.raises(PatchNotApplied, match=r"new\.py: the agent made it, and you made a file there too"):
        apply_patch_set(repo, report2.patch_set)
    assert (repo / "new.py").read_text() == "mine\n"

    # A clean tree: applied, exactly.
    applied = apply_patch_set(repo, patch)
    assert applied.files == ["a.py", "sub/b.py"] and not applied.merged and not applied.left_out
    assert (repo / "a.py").read_text() == "A = 2\n" and (repo / "sub" / "b.py").read_text() == "B = 2\n"


async def test_a_latin1_file_round_trips_byte_exactly(tmp_path: Path) -> None:
    """Before: a Latin-1 file was decoded with replacement characters, so the patch did not apply
    while summary.json said fixed."""
    original = b"# -*- coding: latin-1 -*-\nNAME = '\xe9t\xe9'\n"
    repo = make_repo(tmp_path / "repo", {"legacy.py": original, "crlf.txt": b"one\r\ntwo\r\n"})
    report = await stocked_report(
        repo,
        tmp_path / "run",
        "sed -i 's/\\xe9t\\xe9/\\xe9t\\xe9 \\xe0 Paris/' legacy.py && printf 'one\\r\\n2\\r\\n' > crlf.txt",
    )
    outcome = hand_back(report, repo, mode=YES, say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.hand_back == "applied"
    assert (repo / "legacy.py").read_bytes() == b"# -*- coding: latin-1 -*-\nNAME = '\xe9t\xe9 \xe0 Paris'\n"
    assert (repo / "crlf.txt").read_bytes() == b"one\r\n2\r\n"
    # The kept patch is the same bytes: git applies it to the starting tree exactly.
    fresh = make_repo(tmp_path / "fresh", {"legacy.py": original, "crlf.txt": b"one\r\ntwo\r\n"})
    git(fresh, "apply", str(report.patch_path))
    assert (fresh / "legacy.py").read_bytes() == (repo / "legacy.py").read_bytes()


#: What a suite run with coverage in parallel mode, Hypothesis and an HTML report leaves behind,
#: beside the agent's fix; and a ``.coveragerc`` the agent writes on purpose.
TEST_RUN_DEBRIS = (
    "echo 'A = 2' > a.py && printf '[run]\\nparallel = true\\n' > .coveragerc && "
    "for i in $(seq 1 40); do head -c 3000 /dev/urandom > .coverage.host.$i.X$i; done && "
    "head -c 3000 /dev/urandom > .coverage && head -c 3000 /dev/urandom > sub/.coverage && "
    "echo '<coverage/>' > coverage.xml && mkdir -p .hypothesis/examples/ab htmlcov && "
    "head -c 300 /dev/urandom > .hypothesis/examples/ab/cd && echo '<html/>' > htmlcov/index.html && "
    "echo 'changed' > tracked.coverage.dat && echo theirs > .coverage.tracked"
)


async def test_what_test_runs_write_is_left_out_of_the_patch_and_named(tmp_path: Path) -> None:
    """Before: a suite writing coverage data on each run (no .gitignore in an sdist) handed back
    every `.coverage.*` file as a binary change, so `--yes` applied nothing."""
    repo = make_repo(
        tmp_path / "repo",
        {
            "a.py": "A = 1\n",
            "sub/b.py": "B = 1\n",
            "tracked.coverage.dat": "x\n",
            ".coverage.tracked": "mine\n",
        },
    )
    report = await stocked_report(repo, tmp_path / "run", TEST_RUN_DEBRIS)
    patch = report.patch_set
    # the fix, the file written on purpose, and the files the user tracks: in the patch as before
    assert patch.files == [".coverage.tracked", ".coveragerc", "a.py", "tracked.coverage.dat"]
    left = report.left_out
    coverage = [
        p for p, why in left.items() if why == "coverage data, written by test runs, not part of the change"
    ]
    assert len(coverage) == 42 and "sub/.coverage" in coverage and ".coverage" in coverage
    assert left["coverage.xml"].startswith("a coverage report, written by test runs")
    assert left["htmlcov"].startswith("a coverage report, written by test runs")
    assert left[".hypothesis"].startswith("Hypothesis's example database, written by test runs")
    assert len(left) == 45
    lines = left_out_lines(left)
    assert (
        len(lines) == 4
        and lines[0].startswith("42 files (")
        and ", ...): coverage data, written by" in lines[0]
    )
    question = decision.question(report, repo)
    assert question.count("left out") == 4 and "42 files" in question
    # text edits only: --yes applies the patch
    assert patch.to_confirm == []
    outcome = hand_back(report, repo, mode=YES, say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.hand_back == "applied", outcome.message
    assert (repo / ".coverage.tracked").read_text() == "theirs\n"
    assert (repo / "a.py").read_text() == "A = 2\n" and (repo / ".coveragerc").exists()
    assert not (repo / ".coverage").exists() and not (repo / "htmlcov").exists()
    assert not list(repo.glob(".coverage.host.*")) and not (repo / ".hypothesis").exists()
