"""``clover-agent run``: one instruction, headless, on a folder, for harnesses (docs/run.md).

:func:`run_once` runs the agent once on ``--dir`` with policy ``ci`` (nothing asks; what would ask
is denied) and no verdict: there is no failing test to judge by, so the agent's ``finish`` summary
is reported as its claim and ``result.json`` says ``"verdict": null``. The host takes stock of the
folder before and after (:class:`~clover_agent.handback.stock.Stock`, which needs no git
repository: its baseline lives in a shadow repository in the output folder), writes the change as
``patch.diff``, and, when the agent worked on a copy (``--sandbox docker|local``), writes it back
into the folder without asking (:func:`~clover_agent.handback.apply.apply_patch_set`: never into
``.git`` or ``.clover``, never outside the folder, never through a symlink). With ``--sandbox none``
the agent works in the folder itself, with no isolation: only for a container thrown away after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import RunResult
from clover_agent.agent.policy import preset
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.ci.safety import local_environment, sandbox_environment
from clover_agent.errors import RUN_ERRORS, ExitCode, UsageError, exit_code_for, message_of
from clover_agent.events import ErrorReported, EventBus, TaskFinished, TaskStarted
from clover_agent.fix.console import ConsoleRenderer, make_console
from clover_agent.fix.runs import PATCH_FILE, new_run_id, runs_dir
from clover_agent.handback.apply import apply_patch_set
from clover_agent.handback.stock import SHADOW_DIR, Kept, Stock
from clover_agent.launch import (
    BackendOptions,
    backend_factory,
    check_backend_options,
    probe_backend,
    sandbox_spec,
)
from clover_agent.safe_text import terminal_safe
from clover_agent.session.assembly import AgentSession, SessionConfig
from clover_agent.settings import Settings, repo_settings

RESULT_FILE = "result.json"
#: ``--sandbox`` values: a copy in a container or on this machine, or the folder itself.
RUN_SANDBOXES = ("docker", "local", "none")
#: A variable whose name holds one of these never reaches the agent's commands with ``--sandbox none``.
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
#: How the request is framed for the model (the instruction is the user's own, not a third party's).
TASK_NOTE = (
    "Work in /workspace until the instruction below is done, then call `finish` with a short summary "
    "of what you did. No one will answer questions: decide yourself.\n\nInstruction:\n"
)


@dataclass
class RunRequest:
    """What ``clover-agent run`` was asked."""

    instruction: str
    folder: Path
    backend: BackendOptions
    output_dir: Path | None = None
    sandbox: str = "docker"
    image: str | None = None
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None


@dataclass
class _Outcome:
    exit_code: int = ExitCode.FAILURE
    message: str = ""
    agent: RunResult | None = None
    kept: Kept | None = None
    applied: list[str] = field(default_factory=list)
    apply_problem: str = ""


def output_folder(requested: Path | None, folder: Path, run_id: str) -> Path:
    """Where the run's files go: ``requested`` (made; refused inside the folder except under its
    ``.clover``, since the folder's change is what is measured), else ``FOLDER/.clover/runs/ID``,
    else (the folder not writable) a new temporary folder."""
    if requested is not None:
        out = requested.resolve()
        inside = out == folder or folder in out.parents
        if inside and not (out.relative_to(folder).parts[:1] == (".clover",)):
            raise UsageError(
                f"--out {requested} lies in --dir {folder}: choose a folder outside it (or in .clover/)"
            )
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UsageError(f"--out {requested} is not an empty folder")
        out.mkdir(parents=True, exist_ok=True)
        return out
    with contextlib.suppress(OSError, UsageError):
        out = runs_dir(folder) / run_id
        out.mkdir(parents=True)
        return out
    return Path(tempfile.mkdtemp(prefix=f"clover-run-{run_id}-"))


def run_once(request: RunRequest, settings: Settings, *, out: TextIO, err: TextIO) -> int:
    """Run ``request``; the log goes to ``err``, one summary line to ``out``; returns the exit code."""
    started = time.monotonic()
    folder = request.folder.resolve()
    if not folder.is_dir():
        raise UsageError(f"--dir {request.folder}: not a folder")
    if not request.instruction.strip():
        raise UsageError("the instruction is empty")
    if request.sandbox not in RUN_SANDBOXES:
        raise UsageError(f"--sandbox {request.sandbox}: choose one of {', '.join(RUN_SANDBOXES)}")
    run_id = new_run_id()
    output = output_folder(request.output_dir, folder, run_id)
    bus = EventBus()
    writer = TrajectoryWriter(output / TRAJECTORY_FILE)
    bus.subscribe(writer)
    bus.subscribe(ConsoleRenderer(make_console(err), live=False))
    if request.sandbox == "none":
        err.write("warning: --sandbox none: the agent works in the folder itself, with no isolation\n")
    bus.emit(TaskStarted(run_id=run_id, command="run", target="", repo=str(folder), sandbox=request.sandbox))
    outcome = _Outcome()
    try:
        try:
            backend = check_backend_options(request.backend, settings)
            asyncio.run(probe_backend(backend, settings))  # before any sandbox is made
            asyncio.run(_work(request, settings, backend, folder, output, run_id, bus, outcome))
        except KeyboardInterrupt:
            outcome.exit_code, outcome.message = ExitCode.INTERRUPTED, "interrupted"
        except RUN_ERRORS as exc:
            outcome.exit_code, outcome.message = exit_code_for(exc), message_of(exc)
            if outcome.exit_code == ExitCode.SANDBOX_UNAVAILABLE and request.sandbox == "docker":
                outcome.message += (
                    " (inside a container you throw away, --sandbox none works in the folder itself)"
                )
        result = _result(request, folder, output, outcome, time.monotonic() - started)
        bus.emit(
            TaskFinished(
                run_id=run_id, command="run", exit_code=result["exit_code"], message=result["message"]
            )
        )
    finally:
        writer.close()
        shutil.rmtree(output / SHADOW_DIR, ignore_errors=True)
        if not (output / PATCH_FILE).exists():  # the run stopped before the folder was read back
            (output / PATCH_FILE).write_bytes(b"")
    (output / RESULT_FILE).write_text(
        json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    files = len(result["files"])
    out.write(
        terminal_safe(
            f"clover-agent run: {result['outcome']} (exit {result['exit_code']}): {result['message']}; "
            f"{files} file{'s' if files != 1 else ''} changed{'' if result['applied'] or not files else ', not applied'}; "
            f"{output}/"
        )
        + "\n"
    )
    out.flush()
    return int(result["exit_code"])


async def _work(
    request: RunRequest,
    settings: Settings,
    backend_options: BackendOptions,
    folder: Path,
    output: Path,
    run_id: str,
    bus: EventBus,
    outcome: _Outcome,
) -> None:
    configured = repo_settings(folder, trusted=False)
    docker = request.sandbox == "docker"
    spec = sandbox_spec(
        settings,
        folder,
        image=request.image,
        network=False,
        env=sandbox_environment(settings.environment) if docker else {},
        host_env=settings.docker_env if docker else _commands_environment(request.sandbox, settings),
        repo_config=configured,
    )
    spec.setup_network = False
    config = SessionConfig(
        repo=folder,
        make_backend=backend_factory(backend_options, settings),
        spec=spec,
        sandbox_kind=request.sandbox,
        policy=preset("ci"),
        max_steps=request.max_steps,
        max_time_s=request.max_time_s,
        max_tokens=request.max_tokens,
        checkpoints=request.sandbox != "none",
    )
    parts = AgentSession(
        config,
        bus,
        run_id=run_id,
        folder=output,
        report=lambda message: bus.emit(ErrorReported(kind="mcp", message=message)),
    )
    stock = Stock(output, folder)
    try:
        sandbox = await parts.open_sandbox()
        await stock.record_start(sandbox)
        backend = config.make_backend()
        try:
            budget = Budget(config.max_steps, config.max_time_s, config.max_tokens)
            agent = await parts.open_agent(backend, budget, None)
            try:
                outcome.agent = await agent.run(TASK_NOTE + request.instruction, await parts.system_prompt())
            except (asyncio.CancelledError, KeyboardInterrupt):
                outcome.agent = agent.result
                raise
        finally:
            try:
                await parts.close_agent()
            finally:
                await backend.close()
        outcome.kept = await stock.take(sandbox, output / PATCH_FILE)
    finally:
        await parts.close()
    result = outcome.agent
    outcome.exit_code, outcome.message = result.exit_code, result.message
    patch = outcome.kept.patch_set
    if patch is None:
        outcome.exit_code, outcome.message = ExitCode.SANDBOX_UNAVAILABLE, outcome.kept.problem
    elif request.sandbox == "none":
        outcome.applied = patch.files  # the agent changed the folder itself
    elif patch.changes:
        had_state = (folder / ".clover").exists()
        try:
            applied = await asyncio.to_thread(apply_patch_set, folder, patch)
        except RUN_ERRORS as exc:
            outcome.apply_problem = message_of(exc)
            outcome.exit_code, outcome.message = (
                exit_code_for(exc),
                f"the change was not written back: {outcome.apply_problem}",
            )
        else:
            outcome.applied = list(applied.files)
        finally:
            if not had_state:  # the apply's staging folder: the folder is left as the agent made it
                with contextlib.suppress(OSError):
                    (folder / ".clover").rmdir()


def _commands_environment(sandbox: str, settings: Settings) -> dict[str, str]:
    """What the agent's commands inherit on this machine: with ``local``, the CI bot's few
    variables; with ``none`` (inside a harness's container, whose image sets what its tasks need),
    this process's environment without clover-agent's own variables and any whose name says it
    holds a secret (:data:`SECRET_WORDS`): the model server's key stays with the backend."""
    if sandbox != "none":
        return local_environment(settings.environment)
    return {
        name: value
        for name, value in settings.environment.items()
        if not name.upper().startswith("CLOVER_") and not any(w in name.upper() for w in SECRET_WORDS)
    }


def _result(
    request: RunRequest, folder: Path, output: Path, outcome: _Outcome, elapsed: float
) -> dict[str, Any]:
    """``result.json``'s content (docs/run.md)."""
    agent = outcome.agent
    stats = agent.stats if agent is not None else {}
    patch = outcome.kept.patch_set if outcome.kept is not None else None
    return {
        "version": 1,
        "command": "run",
        "outcome": agent.outcome if agent is not None else "error",
        "exit_code": int(outcome.exit_code),
        "message": outcome.message,
        "verdict": None,
        "claim": agent.summary if agent is not None and agent.submitted else None,
        "summary": agent.summary if agent is not None else "",
        "steps": stats.get("steps", 0),
        "tokens": stats.get("tokens", 0),
        "elapsed_s": round(elapsed, 3),
        "agent_elapsed_s": stats.get("elapsed_s"),
        "dir": str(folder),
        "sandbox": request.sandbox,
        "files": patch.files if patch is not None else [],
        "left_out": patch.left_out if patch is not None else {},
        "applied": bool(outcome.applied) and not outcome.apply_problem,
        "applied_files": outcome.applied,
        "patch": PATCH_FILE,
        "trajectory": TRAJECTORY_FILE,
    }
