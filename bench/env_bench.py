"""Project environments: cold set-up and warm start per real project, and a ``fix`` run's time with
the regression run over the whole suite vs narrowed to the related tests.

Usage: .venv/bin/python bench/env_bench.py [--warm N] [--no-fix] [--no-write]

For each project (pinned sdists from the package index, as the end-to-end tests use): the Docker
sandbox's start with no environment image (cold: the set-up runs and is cached), then N starts
from the cached image (warm), with the environment's image removed afterwards. Then ``fix`` with
the replay backend on one project with a bug injected, ``--regression`` suite, related and none.
Prints a Markdown section and (unless --no-write) puts it in bench/RESULTS.md, replacing the
previous one. Needs a Docker engine, the sandbox image and the package index.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_agent.fix.regression import REGRESSION_SCOPES  # noqa: E402
from clover_agent.launch import sandbox_spec  # noqa: E402
from clover_agent.sandboxes.factory import create_sandbox  # noqa: E402
from clover_agent.settings import Settings  # noqa: E402
from tests.real_projects import (  # noqa: E402
    PROJECTS,
    drop_image,
    environment_image,
    fetch_sdist,
    inject,
    replay_file,
)

RESULTS = Path(__file__).with_name("RESULTS.md")
#: The project the fix runs are timed on: the largest suite of the three (1,200+ tests).
FIX_PROJECT = "marshmallow"
START, END = "<!-- env-bench:start -->", "<!-- env-bench:end -->"


async def start_once(repo: Path) -> tuple[float, str]:
    spec = sandbox_spec(Settings.load(), repo, environment=True)
    started = time.monotonic()
    async with create_sandbox("docker", spec) as sb:
        elapsed = time.monotonic() - started
        return elapsed, sb.image or ""


def fix_time(repo: Path, project, scope: str) -> tuple[float, int]:
    inject(repo, project)
    replay = replay_file(repo.parent / f"{scope}.replay.jsonl", project)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", project.target, "--repo", str(repo), "--backend",
         "replay", "--replay", str(replay), "--yes", "--regression", scope],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    return time.monotonic() - started, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=5, help="warm starts per project")
    parser.add_argument("--no-fix", action="store_true", help="skip the fix-run comparison")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    rows, fix_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for project in PROJECTS:
            repo = fetch_sdist(project.name, project.version, Path(tmp) / project.name)
            drop_image(environment_image(repo))  # so the first start really sets the project up
            cold, tag = asyncio.run(start_once(repo))
            warm = [asyncio.run(start_once(repo))[0] for _ in range(args.warm)]
            if not args.no_fix and project.name == FIX_PROJECT:
                for scope in REGRESSION_SCOPES:
                    fix_rows.append((project, scope, *fix_time(repo, project, scope)))
            drop_image(tag)
            rows.append((project, cold, statistics.median(warm)))
    load = os.getloadavg()[0]
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        START,
        "## Project environments: cold set-up, warm start, fix with a narrowed regression run",
        "",
        f"{platform.node()} ({os.cpu_count()} CPUs), {dt.date.today()}, commit {commit}, load average {load:.1f}. "
        f"Docker sandbox, default limits; cold = first start (set-up from the package index, cached as an "
        f"image), warm = median of {args.warm} starts from the cached image. `bench/env_bench.py`.",
        "",
        "| project | cold set-up + start (s) | warm start (s) | ratio |",
        "|---|---|---|---|",
        *(
            f"| {p.name} {p.version} | {cold:.1f} | {warm:.2f} | {cold / warm:.0f}x |"
            for p, cold, warm in rows
        ),
    ]
    if fix_rows:
        suite = next(t for _, s, t, _ in fix_rows if s == "suite")
        lines += [
            "",
            f"`clover-agent fix` on {fix_rows[0][0].name} (bug injected, fix replayed, cached environment):",
            "",
            "| --regression | time (s) | exit code | vs suite |",
            "|---|---|---|---|",
            *(f"| {s} | {t:.1f} | {code} | {t / suite:.2f} |" for _, s, t, code in fix_rows),
            "",
            "Each phase runs its regression tests once (before: free text's suite run is reused; after: in the "
            "verifying sandbox), with pytest-xdist where the project has it. `none` ends with exit 8 (fixed, "
            "suite unverified): only the target was checked.",
        ]
    lines.append(END)
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        text = RESULTS.read_text()
        if START in text:
            text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
