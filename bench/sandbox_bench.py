"""Sandbox benchmark: container start on a warm image, and the round trip of ``true`` through the
sandbox's long-lived runner session vs ``docker exec`` from the CLI on the same container.

Usage: .venv/bin/python bench/sandbox_bench.py [--starts N] [--round-trips N] [--no-write]
Prints a Markdown section and (unless --no-write) puts it in bench/RESULTS.md, replacing the
previous sandbox section. Needs a Docker engine and the sandbox image (`clover-agent sandbox build`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes.docker import DockerSandbox
from clover_agent.sandboxes.local import LocalSandbox
from clover_agent.settings import Settings

RESULTS = Path(__file__).with_name("RESULTS.md")
START, END = "<!-- sandbox-bench:start -->", "<!-- sandbox-bench:end -->"


def make_repo(root: Path) -> Path:
    """A small git repository (20 files) like the ones the tests use."""
    repo = root / "repo"
    (repo / "pkg").mkdir(parents=True)
    for i in range(20):
        (repo / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"],
        check=True,
    )
    return repo


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


async def measure(repo: Path, starts: int, round_trips: int) -> dict[str, list[float]]:
    spec = sandbox_spec(Settings.load(), repo)
    out: dict[str, list[float]] = {"start": [], "close": [], "sandbox": [], "docker_exec": [], "local": []}
    async with DockerSandbox(spec):  # warm the image and the engine's caches
        pass
    for _ in range(starts):
        sandbox = DockerSandbox(spec)
        t = time.perf_counter()
        await sandbox.start()
        out["start"].append(time.perf_counter() - t)
        t = time.perf_counter()
        await sandbox.close()
        out["close"].append(time.perf_counter() - t)
    async with DockerSandbox(spec) as sandbox:
        for _ in range(10):
            await sandbox.exec("true")
        # Interleave the two ways, so both see the same machine load.
        for i in range(round_trips):
            t = time.perf_counter()
            result = await sandbox.exec("true")
            out["sandbox"].append(time.perf_counter() - t)
            assert result.exit_code == 0
            if i % 5 == 0:
                t = time.perf_counter()
                subprocess.run(["docker", "exec", sandbox.container_id, "true"], check=True)
                out["docker_exec"].append(time.perf_counter() - t)
    async with LocalSandbox(spec) as local:
        for _ in range(round_trips):
            t = time.perf_counter()
            await local.exec("true")
            out["local"].append(time.perf_counter() - t)
    return out


def machine_facts() -> list[str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor() or "unknown",
    )
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    version = docker.from_env().version()
    commit = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; commit {commit or 'unknown'}",
        f"- nproc: {nproc}; CPU: {cpu}; load average at start: {load} (a shared machine: compare rows "
        "of one run, not runs)",
        f"- Docker engine {version.get('Version')} (API {version.get('ApiVersion')}), kernel {platform.release()}",
    ]


def report(out: dict[str, list[float]]) -> str:
    lines = [
        START,
        "## Sandbox: start and command round trip",
        "",
        *machine_facts(),
        "",
        "Medians, measured side by side in one run (`bench/sandbox_bench.py`).",
        "",
        "| what | median | samples |",
        "|---|---|---|",
        f"| Docker sandbox start on a warm image (create, copy repo, runner, git baseline) | {ms(out['start'])} | {len(out['start'])} |",
        f"| Docker sandbox close (container removal) | {ms(out['close'])} | {len(out['close'])} |",
        f"| `true` through the sandbox's runner session | {ms(out['sandbox'])} | {len(out['sandbox'])} |",
        f"| `docker exec CONTAINER true` from the CLI, same container | {ms(out['docker_exec'])} | {len(out['docker_exec'])} |",
        f"| `true` through the local sandbox (reference) | {ms(out['local'])} | {len(out['local'])} |",
        "",
        f"Goal: <= 10 ms per command, start <= 1 s. The session is "
        f"{statistics.median(out['docker_exec']) / statistics.median(out['sandbox']):.0f}x faster than `docker exec`.",
        END,
    ]
    return "\n".join(lines)


def write_results(section: str, start: str = START, end: str = END) -> None:
    """Put ``section`` in RESULTS.md between the ``start`` and ``end`` markers (appended when absent)."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(measure(make_repo(Path(tmp)), args.starts, args.round_trips))
    section = report(out)
    print(section)
    if not args.no_write:
        write_results(section)


if __name__ == "__main__":
    main()
