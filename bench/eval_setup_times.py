"""Eval tasks' sandbox set-up: per task, the Docker sandbox's start with its project environment
cold (the task's own environment image removed first, so the set-up runs) with each installer in
turn, back to back (pip, then uv: load affects both alike), and then warm (started again from the
image the last cold start cached).

Usage: .venv/bin/python bench/eval_setup_times.py [TASKS] [--only ID...] [--installers pip,uv]
       [--warm N] [--out FILE]

Each task's repository is made as ``clover-agent eval`` makes it (the release, the test patch
committed) and its sandbox spec is the harness's (the task's ``environment`` and ``setup``).
Each cold start's set-up lines must name the installer asked for (``environment: installer ...``);
one that fell back to pip is marked "pip fallback". Prints progress, then a Markdown table with each installer's
median and total; ``--out`` writes the figures as JSON. The load average is read before and after.
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

from clover_agent.environments.recipe import INSTALLERS  # noqa: E402
from clover_agent.errors import RUN_ERRORS, message_of  # noqa: E402
from clover_agent.eval.harness import EvalOptions, prepare_repo, task_spec  # noqa: E402
from clover_agent.eval.tasks import Task, load_tasks  # noqa: E402
from clover_agent.sandboxes.base import SandboxSpec  # noqa: E402
from clover_agent.sandboxes.docker import docker_client  # noqa: E402
from clover_agent.sandboxes.env_image import environment_tag, remove_images  # noqa: E402
from clover_agent.sandboxes.factory import create_sandbox  # noqa: E402
from clover_agent.sandboxes.images import compiler_tag  # noqa: E402
from clover_agent.settings import Settings  # noqa: E402

DEFAULT_TASKS = ROOT / "bench" / "tasks"
#: What the Docker sandbox says when it starts from a cached environment image, and when it makes one.
CACHED = "environment: cached"
MAKING = "environment: setting the project up"
#: The set-up line that names the installer, and the one that says uv failed and pip took over.
INSTALLER = "environment: installer "
FALLBACK = "pip, the fallback, tries it"
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


def compiled_image_of(spec: SandboxSpec, settings: Settings) -> str | None:
    """The environment image the sandbox would find first for ``spec`` when one was made in the
    image's compiler variant (a set-up that once needed a compiler); None without a variant."""
    assert spec.image is not None and spec.environment is not None
    client = docker_client(settings.docker_env)
    try:
        variant = compiler_tag(client.api.inspect_image(spec.image)["Id"])
        try:
            return environment_tag(spec.environment, client.api.inspect_image(variant)["Id"])
        except NotFound:
            return None
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


def with_installer(spec: SandboxSpec, installer: str) -> SandboxSpec:
    """``spec`` with its environment set up by ``installer`` (the harness's spec asks for uv, the
    default; pip is each step's pip form)."""
    assert spec.environment is not None
    if spec.environment.installer == installer:
        return spec
    if installer != "pip":
        raise BenchError(
            f"the task's environment is set up with {spec.environment.installer}, not {installer}"
        )
    return dataclasses.replace(spec, environment=spec.environment.with_installer("pip"))


async def start_once(spec: SandboxSpec, task_id: str, label: str) -> tuple[float, str, bool, bool, list[str]]:
    """One start and close of the Docker sandbox: the seconds to started, the image it ran,
    whether it said the environment was cached / was being made, and what it said."""
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
    return elapsed, image, cached, made, lines


def installer_ran(lines: list[str], asked: str) -> str:
    """Which installer the set-up lines say ran: ``asked``, or ``pip (fallback)`` when uv was asked
    for and pip ran instead; a BenchError when they name none."""
    said = [line for line in lines if line.startswith(INSTALLER)]
    if not said:
        raise BenchError("the set-up lines name no installer")
    if asked == "uv" and (not said[0].startswith(f"{INSTALLER}uv ") or any(FALLBACK in x for x in lines)):
        return "pip fallback"
    return asked


def measure(
    task: Task, work: Path, options: EvalOptions, warm_runs: int, installers: list[str]
) -> dict[str, Any]:
    """One task's cold starts (one per installer, back to back) and warm starts; raises BenchError or a
    run error when one fails."""
    _, repo = prepare_repo(task, work, options.settings)
    harness_spec = task_spec(options, repo, task)
    cold: dict[str, float] = {}
    ran: dict[str, str] = {}
    tag, base_size, spec = "", 0, harness_spec
    for installer in installers:
        spec = with_installer(harness_spec, installer)
        tag, base_size = image_of(spec, options.settings)
        drop(tag, options.settings)
        compiled = compiled_image_of(spec, options.settings)
        if compiled:
            drop(compiled, options.settings)
        say(f"  {task.instance_id}: cold start with {installer} ({tag} removed)")
        seconds, image, cached, made, lines = asyncio.run(
            start_once(spec, task.instance_id, f"cold, {installer}")
        )
        if image != tag or cached or not made:
            raise BenchError(
                f"the cold start did not make {tag} (it ran {image or 'no image'}, cached={cached})"
            )
        cold[installer] = round(seconds, 3)
        ran[installer] = installer_ran(lines, installer)
    warm: list[float] = []
    warm_cached: list[bool] = []
    for number in range(1, warm_runs + 1):
        say(f"  {task.instance_id}: warm start {number}/{warm_runs}")
        seconds, image, cached, made, _ = asyncio.run(start_once(spec, task.instance_id, "warm"))
        if image != tag or made:
            raise BenchError(f"warm start {number} did not start from {tag} (it ran {image or 'no image'})")
        warm.append(seconds)
        warm_cached.append(cached)
    size = image_size(tag, options.settings)
    return {
        "instance_id": task.instance_id,
        "project": task.repo.value if task.repo.kind == "sdist" else task.repo.describe(),
        "image": tag,
        "cold_s": cold,
        "installer_ran": ran,
        "warm_s": [round(s, 3) for s in warm],
        "warm_median_s": round(statistics.median(warm), 3) if warm else None,
        "warm_cached": warm_cached,
        "image_bytes": size,
        "environment_bytes": None if size is None else max(0, size - base_size),
        "error": "",
    }


def table(rows: list[dict[str, Any]], warm_runs: int, installers: list[str]) -> str:
    good = [r for r in rows if not r["error"]]
    warm_head = "warm s" if warm_runs == 1 else f"warm s (median of {warm_runs})"
    heads = [f"cold s, {i}" for i in installers]
    if len(installers) == 2:
        heads.append(f"{installers[0]}/{installers[1]}")
    heads += [warm_head, f"image MB, {installers[-1]} (environment's layers)"]
    lines = [f"| task | project | {' | '.join(heads)} |", "|---|---|" + "---:|" * len(heads)]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['instance_id']} | {r['project']} | failed | {r['error']} |")
            continue
        size = (
            "-"
            if r["image_bytes"] is None
            else f"{r['image_bytes'] / MB:.0f} ({r['environment_bytes'] / MB:.0f})"
        )
        cells = [
            f"{r['cold_s'][i]:.1f}" + ("" if r["installer_ran"][i] == i else f" ({r['installer_ran'][i]})")
            for i in installers
        ]
        if len(installers) == 2:
            cells.append(f"{r['cold_s'][installers[0]] / r['cold_s'][installers[1]]:.1f}x")
        cells += ["-" if r["warm_median_s"] is None else f"{r['warm_median_s']:.2f}", size]
        lines.append(f"| {r['instance_id']} | {r['project']} | {' | '.join(cells)} |")
    if good:
        lines.append("")
        for i in installers:
            colds = [r["cold_s"][i] for r in good]
            lines.append(
                f"{i}: cold median {statistics.median(colds):.1f} s, total {sum(colds):.0f} s over "
                f"{len(good)} task(s)."
            )
        if len(installers) == 2:
            ratios = [r["cold_s"][installers[0]] / r["cold_s"][installers[1]] for r in good]
            lines.append(
                f"{installers[0]}/{installers[1]} per task: median {statistics.median(ratios):.1f}x."
            )
        warms = [r["warm_median_s"] for r in good if r["warm_median_s"] is not None]
        if warms:
            lines.append(f"Warm median {statistics.median(warms):.2f} s.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="?", default=str(DEFAULT_TASKS), help="task folder or .jsonl")
    parser.add_argument("--only", nargs="+", metavar="ID", help="measure these tasks only")
    parser.add_argument("--warm", type=int, default=1, help="warm starts per task (default 1; 0: none)")
    parser.add_argument(
        "--installers",
        default="pip,uv",
        help="the installers whose cold set-ups are timed, in this order, per task (default pip,uv)",
    )
    parser.add_argument("--image", help="the sandbox image (as eval's --image)")
    parser.add_argument("--wheels", help="a wheel folder for the set-up (as eval's --wheels)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.warm < 0:
        parser.error("--warm must be 0 or more")
    installers = [i.strip() for i in args.installers.split(",") if i.strip()]
    if (
        not installers
        or any(i not in INSTALLERS for i in installers)
        or len(set(installers)) < len(installers)
    ):
        parser.error(f"--installers: a comma-separated list of {', '.join(INSTALLERS)}")
    tasks = load_tasks(Path(args.tasks))
    if args.only:
        unknown = sorted(set(args.only) - {t.instance_id for t in tasks})
        if unknown:
            parser.error(f"--only: no task {', '.join(unknown)} in {args.tasks}")
        tasks = [t for t in tasks if t.instance_id in set(args.only)]
    settings = Settings.load()
    rows: list[dict[str, Any]] = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eval-setup-") as tmp:
        options = EvalOptions(output_dir=Path(tmp), settings=settings, image=args.image, wheels=args.wheels)
        for number, task in enumerate(tasks, 1):
            say(f"[{number}/{len(tasks)}] {task.instance_id}: making the repository ({task.repo.describe()})")
            try:
                row = measure(task, Path(tmp) / task.instance_id, options, args.warm, installers)
            except (BenchError, *RUN_ERRORS, DockerException, OSError) as exc:
                text = message_of(exc) or type(exc).__name__
                first = (text.strip().splitlines() or [type(exc).__name__])[0].replace("|", "/")
                say(f"[{number}/{len(tasks)}] {task.instance_id}: FAILED: {text}")
                row = {"instance_id": task.instance_id, "project": task.repo.describe(), "error": first}
            else:
                colds = ", ".join(f"{i} {s:.1f} s" for i, s in row["cold_s"].items())
                say(
                    f"[{number}/{len(tasks)}] {task.instance_id}: cold {colds}; warm {row['warm_median_s']} s"
                )
            rows.append(row)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}, {platform.system()})",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "load_average_before": load_before,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "installers": installers,
        "image": args.image or settings.sandbox_image,
        "tasks_from": str(args.tasks),
        "warm_runs": args.warm,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print()
    print(
        f"{meta['machine']}, {meta['date']}, commit {commit}, image {meta['image']}, load average "
        f"{' '.join(str(x) for x in load_before)} before, {' '.join(str(x) for x in meta['load_average'])} "
        f"after, {meta['wall_s']:.0f} s"
    )
    print()
    print(table(rows, args.warm, installers))
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
