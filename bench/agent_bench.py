"""Agent-step benchmark: the runtime's own cost per agent step, and the trajectory's bytes per step.

A replayed model (recorded turns, no model: each model call costs nothing) drives the real agent
loop on a warm Docker sandbox over a small repository; every step is one tool call. What a step
costs is then the runtime: parsing the turn, the policy, checkpoints, the call's round trip
through the sandbox, events and the trajectory. Two kinds of step: ``shell`` running ``echo``
(a call that may change the workspace but does not) and ``editor`` ``str_replace`` (one that
does).

"before" is the agent's checkpointing as it was: a snapshot (a commit in the sandbox) before every
call that may change the workspace and the diff read after each, in its own script
(:class:`EveryCallCheckpoints` puts that back), and a trajectory holding every event whole,
streamed deltas included. "now" is the agent as it is: a look after such a call that costs a
runner request (the workspace's stat fingerprint) when nothing changed, and one script (commit and
diff) when something did. Both rows run today's shell tool and sandbox (the shell wrapper itself
went from six processes to one; ``bench/sandbox_bench.py`` times the round trips).
The runs alternate, so both see the same machine load; the figures are medians over the steps.

Usage: .venv/bin/python bench/agent_bench.py [--steps N] [--rounds N] [--no-write]
Prints a Markdown section and (unless --no-write) puts it in bench/RESULTS.md, replacing the
previous agent section. Needs a Docker engine and the sandbox image (`clover-agent sandbox build`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clover_agent.agent.budget import Budget
from clover_agent.agent.checkpoints import Checkpoint, Checkpoints, Look
from clover_agent.agent.loop import Agent
from clover_agent.agent.trajectory import TrajectoryWriter
from clover_agent.backends.replay import ReplayBackend
from clover_agent.events import Event, EventBus, ModelResponded
from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.docker import DockerSandbox
from clover_agent.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))
from sandbox_bench import machine_facts, make_repo, write_results

START, END = "<!-- agent-bench:start -->", "<!-- agent-bench:end -->"


class EveryCallCheckpoints(Checkpoints):
    """The checkpoints as they were: a snapshot before every call that may change the workspace,
    and the workspace always taken as changed after it (so its diff is read)."""

    async def before_call(self, turn: int, tool: str) -> Checkpoint | None:
        return await self.snapshot(turn, tool)

    async def look(self, *, with_diff: bool = False) -> Look:
        return Look(True)


def call(name: str, **arguments: str) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def turns(kind: str, steps: int) -> list[str]:
    """``steps`` recorded turns of one kind of call (each different: the agent would call
    repeating ones stuck), then ``finish``."""
    if kind == "shell":
        calls = [call("shell", command=f"echo step {i}") for i in range(steps)]
    else:
        calls = [
            call("editor", command="str_replace", path="/workspace/pkg/m0.py", old_str=f"x + {i}\n",
                 new_str=f"x + {i + 1}\n")
            for i in range(steps)
        ]  # fmt: skip
    reasoning = "<think>\nThe next step of the plan.\n</think>\n\n"
    return [reasoning + c for c in calls] + [call("finish", summary="done")]


class FullTrajectory:
    """Bytes of the trajectory as it was written before: every event whole, one JSON line each."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, event: Event) -> None:
        self.bytes += len(json.dumps(event.to_dict(), ensure_ascii=False, default=str).encode()) + 1


class TimedSandbox:
    """Adds up the time spent in the sandbox's round trips (commands and file operations)."""

    METHODS = (
        "exec",
        "read_file",
        "read_lines",
        "write_file",
        "list_files",
        "list_entries",
        "diff",
        "fingerprint",
    )

    def __init__(self, sandbox: Sandbox) -> None:
        self.seconds = 0.0
        self.depth = 0  # diff() runs exec(): count the outer call only
        for name in self.METHODS:
            if hasattr(sandbox, name):
                setattr(sandbox, name, self._timed(getattr(sandbox, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            self.depth += 1
            try:
                return await method(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds += time.perf_counter() - started

        return timed


async def one_run(
    sandbox: DockerSandbox, timed: TimedSandbox, folder: Path, kind: str, steps: int, before: bool
) -> dict[str, Any]:
    """One agent run of ``steps`` calls; per-step times (between consecutive model turns), time in
    the sandbox per step, and trajectory bytes per step."""
    replay = folder / f"{kind}.jsonl"
    replay.write_text("".join(json.dumps({"content": t}) + "\n" for t in turns(kind, steps)))
    await sandbox.exec("git checkout -q -- . && git clean -qfd", cwd="/workspace")
    bus = EventBus()
    stamps: list[tuple[float, float]] = []
    bus.subscribe(
        lambda e: (
            stamps.append((time.perf_counter(), timed.seconds)) if isinstance(e, ModelResponded) else None
        )
    )
    path = folder / f"{kind}-{'before' if before else 'now'}.jsonl"
    path.unlink(missing_ok=True)
    writer = TrajectoryWriter(path)
    bus.subscribe(writer)
    full = FullTrajectory()
    bus.subscribe(full)
    agent = Agent(ReplayBackend(replay), sandbox, bus, run_id=f"bench-{time.monotonic_ns()}",
                  budget=Budget(max_steps=steps + 5))  # fmt: skip
    if before:
        agent.checkpoints = agent.caller.checkpoints = EveryCallCheckpoints(sandbox, agent.run_id)
    result = await agent.run("Benchmark task.", "You are a benchmark agent.")
    writer.close()
    assert result.submitted, result.message
    pairs = list(itertools.pairwise(stamps))
    return {
        "step": [b[0] - a[0] for a, b in pairs],
        "sandbox": [b[1] - a[1] for a, b in pairs],
        "bytes": (full.bytes if before else path.stat().st_size) / (steps + 1),
    }


async def measure(repo: Path, folder: Path, steps: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    spec = sandbox_spec(Settings.load(), repo)
    out: dict[str, dict[str, list[float]]] = {}
    async with DockerSandbox(spec) as sandbox:
        timed = TimedSandbox(sandbox)
        for _ in range(rounds):
            for kind in ("shell", "editor"):
                for before in (True, False):
                    run = await one_run(sandbox, timed, folder, kind, steps, before)
                    row = out.setdefault(f"{kind}-{'before' if before else 'now'}", {})
                    for key, values in run.items():
                        row.setdefault(key, []).extend(values if isinstance(values, list) else [values])
    return out


def report(out: dict[str, dict[str, list[float]]], steps: int, rounds: int) -> str:
    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1000

    lines = [
        START,
        "## Agent step: runtime cost per step and trajectory bytes",
        "",
        *machine_facts(),
        "",
        f"`bench/agent_bench.py`: the agent loop with a replayed model (no model time) on a warm Docker "
        f"sandbox, {steps} steps a run, {rounds} rounds of runs alternating before / now; medians over "
        "the steps. Runtime = step - sandbox (time in the sandbox's round trips).",
        "",
        "| step | version | ms per step | of it in the sandbox | runtime | trajectory bytes per step |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, what in (("shell", "shell `echo`"), ("editor", "editor `str_replace`")):
        for version in ("before", "now"):
            row = out[f"{kind}-{version}"]
            step, box = ms(row["step"]), ms(row["sandbox"])
            bytes_ = statistics.median(row["bytes"])
            lines.append(
                f"| {what} | {version} | {step:.1f} | {box:.1f} | {step - box:.1f} | {bytes_:,.0f} |"
            )
    shell_now, shell_before = ms(out["shell-now"]["step"]), ms(out["shell-before"]["step"])
    edit_now, edit_before = ms(out["editor-now"]["step"]), ms(out["editor-before"]["step"])
    lines += [
        "",
        f"Ratios before / now: shell step {shell_before / shell_now:.2f}x, editor step "
        f"{edit_before / edit_now:.2f}x; trajectory bytes (shell) "
        f"{statistics.median(out['shell-before']['bytes']) / statistics.median(out['shell-now']['bytes']):.1f}x. "
        f"Goal: <= 20 ms a step; now {shell_now:.1f} ms (shell), {edit_now:.1f} ms (editor).",
        "",
        "A call that changes nothing (the shell row) costs its command and one runner request (the "
        "workspace's stat fingerprint) beyond it. One that changes the workspace (the editor row) also "
        "runs one git script in the sandbox: `add`, `write-tree`, `commit-tree` and `diff`, four git "
        "processes at 1-2 ms each inside the container (the runner copies the private index and the "
        "new ref is written without git).",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="tool calls per run (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four runs (default 3)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(measure(make_repo(Path(tmp)), Path(tmp), args.steps, args.rounds))
    section = report(out, args.steps, args.rounds)
    print(section)
    if not args.no_write:
        write_results(section, START, END)


if __name__ == "__main__":
    main()
