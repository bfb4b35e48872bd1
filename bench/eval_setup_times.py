"""Eval tasks' sandbox set-up: per task, the Docker sandbox's start with its project environment
cold (the task's own environment image removed first, so the set-up runs) and then warm (started
again from the image the cold start cached).

Usage: .venv/bin/python bench/eval_setup_times.py [TASKS] [--only ID...] [--warm N] [--out FILE]

Each task's repository is made as ``clover-agent eval`` makes it (the release, the test patch
committed) and its sandbox spec is the harness's (the task's ``environment`` and ``setup``).
Prints progress, then a Markdown table and its medians; ``--out`` writes the figures as JSON.
Exits 1 naming the tasks whose start failed (the others are still measured). The environment
images are left cached, as an eval run leaves them. Needs a Docker engine and the sandbox image.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from docker.errors import DockerException, NotFound

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_agent.errors import RUN_ERRORS, message_of  # noqa: E402
from clover_agent.eval.harness import EvalOptions, prepare_repo, task_spec  # noqa: E402
from clover_agent.eval.tasks import Task, load_tasks  # noqa: E402
from clover_agent.sandboxes.base import SandboxSpec  # noqa: E402
from clover_agent.sandboxes.docker import docker_client  # noqa: E402
from clover_agent.sandboxes.env_image import environment_tag, remove_images  # noqa: E402
from clover_agent.sandboxes.factory import create_sandbox  # noqa: E402
from clover_agent.settings import Settings  # noqa: E402

DEFAULT_TASKS = ROOT / "bench" / "tasks"
#: What the Docker sandbox says when it starts from a cached environment image, and when it makes one.
CACHED = "environment: cached"
MAKING = "environment: setting the project up"
MB = 1_000_000


class BenchError(Exception):
    """A task that could not be measured, with why."""


def say(text: str) -> None:
    print(text, flush=True)


def image_of(spec: SandboxSpec, settings: Settings) -> tuple[str, int]:
    """The environment image a Docker sandbox of ``spec`` starts from, and the size of the image
    it is made over (the same way the sandbox computes the tag)."""
    if spec.environment is None:
        raise BenchError("the task's sandbox has no project environment (nothing to set up)")
    if spec.compiler:
        raise BenchError("compiler variants are not measured here (their build would be timed too)")
    assert spec.image is not None
    client = docker_client(settings.docker_env)
    try:
        base = client.api.inspect_image(spec.image)
        return environment_tag(spec.environment, base["Id"]), int(base.get("Size") or 0)
    finally:
        client.close()


def drop(tag: str, settings: Settings) -> None:
    """Remove the environment image ``tag`` (this one only); an error when it is still there."""
    client = docker_client(settings.docker_env)
    try:
        remove_images(client, [{"Id": tag}])
        try:
            client.api.inspect_image(tag)
        except NotFound:
            return
        raise BenchError(f"{tag} could not be removed (a container uses it?): no cold start to time")
    finally:
        client.close()


def image_size(tag: str, settings: Settings) -> int | None:
    client = docker_client(settings.docker_env)
    try:
        return int(client.api.inspect_image(tag).get("Size") or 0)
    except DockerException:
        return None
    finally:
        client.close()


async def start_once(spec: SandboxSpec, task_id: str, label: str) -> tuple[float, str, bool, bool]:
    """One start and close of the Docker sandbox: the seconds to started, the image it ran, and
    whether it said the environment was cached / was being made."""
    lines: list[str] = []

    def progress(text: str) -> None:
        lines.append(text)
        say(f"    {task_id} ({label}): {text}")

    spec = dataclasses.replace(spec, progress=progress)
    started = time.monotonic()
    async with create_sandbox("docker", spec) as sb:
        elapsed = time.monotonic() - started
        image = getattr(sb, "image", None) or ""
    cached = any(line.startswith(CACHED) for line in lines)
    made = any(line.startswith(MAKING) for line in lines)
    return elapsed, image, cached, made


def measure(task: Task, work: Path, options: EvalOptions, warm_runs: int) -> dict[str, Any]:
    """One task's cold and warm starts; raises BenchError or a run error when one fails."""
    _, repo = prepare_repo(task, work, options.settings)
    spec = task_spec(options, repo, task)
    tag, base_size = image_of(spec, options.settings)
    drop(tag, options.settings)
    say(f"  {task.instance_id}: cold start ({tag} removed)")
    cold, image, cached, made = asyncio.run(start_once(spec, task.instance_id, "cold"))
    if image != tag or cached or not made:
        raise BenchError(f"the cold start did not make {tag} (it ran {image or 'no image'}, cached={cached})")
    warm: list[float] = []
    warm_cached: list[bool] = []
    for number in range(1, warm_runs + 1):
        say(f"  {task.instance_id}: warm start {number}/{warm_runs}")
        seconds, image, cached, made = asyncio.run(start_once(spec, task.instance_id, "warm"))
        if image != tag or made:
            raise BenchError(f"warm start {number} did not start from {tag} (it ran {image or 'no image'})")
        warm.append(seconds)
        warm_cached.append(cached)
    size = image_size(tag, options.settings)
    return {
        "instance_id": task.instance_id,
        "project": task.repo.value if task.repo.kind == "sdist" else task.repo.describe(),
        "image": tag,
        "cold_s": round(cold, 3),
        "warm_s": [round(s, 3) for s in warm],
        "warm_median_s": round(statistics.median(warm), 3),
        "warm_cached": warm_cached,
        "image_bytes": size,
        "environment_bytes": None if size is None else max(0, size - base_size),
        "error": "",
    }


def table(rows: list[dict[str, Any]], warm_runs: int) -> str:
    good = [r for r in rows if not r["error"]]
    warm_head = "warm s" if warm_runs == 1 else f"warm s (median of {warm_runs})"
    lines = [
        f"| task | project | cold s | {warm_head} | ratio | image MB (environment's layers) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['instance_id']} | {r['project']} | failed | - | - | {r['error']} |")
            continue
        size = (
            "-"
            if r["image_bytes"] is None
            else f"{r['image_bytes'] / MB:.0f} ({r['environment_bytes'] / MB:.0f})"
        )
        lines.append(
            f"| {r['instance_id']} | {r['project']} | {r['cold_s']:.1f} | {r['warm_median_s']:.2f} | "
            f"{r['cold_s'] / r['warm_median_s']:.0f}x | {size} |"
        )
    if good:
        cold = statistics.median(r["cold_s"] for r in good)
        warm = statistics.median(r["warm_median_s"] for r in good)
        ratio = statistics.median(r["cold_s"] / r["warm_median_s"] for r in good)
        lines += [
            "",
            f"Medians over {len(good)} task(s): cold {cold:.1f} s, warm {warm:.2f} s, ratio {ratio:.0f}x; "
            f"cold total {sum(r['cold_s'] for r in good):.0f} s.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="?", default=str(DEFAULT_TASKS), help="task folder or .jsonl")
    parser.add_argument("--only", nargs="+", metavar="ID", help="measure these tasks only")
    parser.add_argument("--warm", type=int, default=1, help="warm starts per task (default 1)")
    parser.add_argument("--image", help="the sandbox image (as eval's --image)")
    parser.add_argument("--wheels", help="a wheel folder for the set-up (as eval's --wheels)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.warm < 1:
        parser.error("--warm must be at least 1")
    tasks = load_tasks(Path(args.tasks))
    if args.only:
        unknown = sorted(set(args.only) - {t.instance_id for t in tasks})
        if unknown:
            parser.error(f"--only: no task {', '.join(unknown)} in {args.tasks}")
        tasks = [t for t in tasks if t.instance_id in set(args.only)]
    settings = Settings.load()
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eval-setup-") as tmp:
        options = EvalOptions(output_dir=Path(tmp), settings=settings, image=args.image, wheels=args.wheels)
        for number, task in enumerate(tasks, 1):
            say(f"[{number}/{len(tasks)}] {task.instance_id}: making the repository ({task.repo.describe()})")
            try:
                row = measure(task, Path(tmp) / task.instance_id, options, args.warm)
            except (BenchError, *RUN_ERRORS, DockerException, OSError) as exc:
                text = message_of(exc) or type(exc).__name__
                first = (text.strip().splitlines() or [type(exc).__name__])[0].replace("|", "/")
                say(f"[{number}/{len(tasks)}] {task.instance_id}: FAILED: {text}")
                row = {"instance_id": task.instance_id, "project": task.repo.describe(), "error": first}
            else:
                say(
                    f"[{number}/{len(tasks)}] {task.instance_id}: cold {row['cold_s']:.1f} s, "
                    f"warm {row['warm_median_s']:.2f} s"
                )
            rows.append(row)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}, {platform.system()})",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "tasks_from": str(args.tasks),
        "warm_runs": args.warm,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print()
    print(
        f"{meta['machine']}, {meta['date']}, commit {commit}, load average "
        f"{' '.join(str(x) for x in meta['load_average'])}"
    )
    print()
    print(table(rows, args.warm))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**meta, "results": rows}, indent=2) + "\n", encoding="utf-8")
    failed = [r["instance_id"] for r in rows if r["error"]]
    if failed:
        print(f"the start failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
