"""What the verdict's checks cost: the verification phase of `fix`, before and after, side by side.

Runs the same replayed fix with two installs of clover-agent in turn (A = the one to measure, B =
a baseline: any Python whose `clover_agent` is another commit, e.g. a copy of the virtual
environment with `pip install --no-deps -e` of a worktree), N times each, A B A B ..., and reads
each run's trajectory: the verification phase is from its first `verification` phase event to
the `task_finished` line (the fresh sandbox, the held-out target and suite runs, the runs on the
patch as handed back and, in A, the canaries, the independent run and the scan). Prints each
side's median, and the median of the pairwise ratios A/B.

    python bench/verify_cost.py --baseline-python /tmp/basevenv/bin/python --runs 3 \\
        --calculator --task cachetools-7.1.8-negative-maxsize

The calculator is `fix test_add` on a fresh copy of examples/calculator with its recorded replay
(`--dry-run`, Docker); a task is `eval bench/tasks --gold --only TASK` (Docker, its environment
cached after the first run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def verification_seconds(trajectory: Path) -> float:
    """From the first ``verification`` phase to ``task_finished``, in seconds."""
    start = end = None
    for line in trajectory.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "phase_started" and event.get("phase") == "verification" and start is None:
            start = event["time"]
        elif event["type"] == "task_finished":
            end = event["time"]
    if start is None or end is None:
        raise SystemExit(f"{trajectory}: no verification phase (the run stopped before it)")
    return end - start


def calculator_run(python: str, scratch: Path) -> float:
    repo = scratch / "calculator"
    shutil.copytree(
        ROOT / "examples" / "calculator", repo, ignore=shutil.ignore_patterns(".clover", "__pycache__")
    )
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "c"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True)
    replay = ROOT / "examples" / "calculator-fix.replay.jsonl"
    done = subprocess.run(
        [python, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--replay", str(replay),
         "--sandbox", "docker", "--dry-run", "-q"],
        check=False, capture_output=True, text=True, cwd=scratch,  # not the checkout: it would shadow B
    )  # fmt: skip
    found = list((repo / ".clover" / "runs").glob("*/trajectory.jsonl"))
    if len(found) != 1:
        raise SystemExit(
            f"{python}: fix left no trajectory (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return verification_seconds(found[0])


def task_run(python: str, scratch: Path, task: str) -> float:
    out = scratch / "eval"
    subprocess.run(
        [python, "-m", "clover_agent", "eval", str(ROOT / "bench" / "tasks"), "--gold", "--only", task,
         "--out", str(out)],
        check=False, capture_output=True, cwd=scratch,
    )  # fmt: skip
    return verification_seconds(out / "work" / task / "run" / "trajectory.jsonl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="A: the install measured")
    parser.add_argument("--baseline-python", required=True, help="B: the baseline install")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calculator", action="store_true")
    parser.add_argument("--task", action="append", default=[])
    args = parser.parse_args()
    cases = (["calculator"] if args.calculator else []) + args.task
    for case in cases:
        times: dict[str, list[float]] = {"A": [], "B": []}
        for _ in range(args.runs + 1):  # the first pair warms the environment image and caches
            pair = {}
            for side, python in (("A", args.python), ("B", args.baseline_python)):
                with tempfile.TemporaryDirectory(prefix="verify-cost-") as scratch:
                    pair[side] = (
                        calculator_run(python, Path(scratch))
                        if case == "calculator"
                        else task_run(python, Path(scratch), case)
                    )
            for side in pair:
                times[side].append(pair[side])
        a, b = times["A"][1:], times["B"][1:]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        print(
            f"{case}: verification A median {statistics.median(a):.2f} s ({', '.join(f'{x:.2f}' for x in a)}); "
            f"B median {statistics.median(b):.2f} s ({', '.join(f'{x:.2f}' for x in b)}); "
            f"A/B median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
