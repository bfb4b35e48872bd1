"""The ``fix`` workflow: reproduce a failing test, let the agent repair it, verify, keep the patch.

0. Right after the sandbox starts, the host takes its own snapshot of the workspace
   (:mod:`clover_agent.fix.stock`): the starting state the patch is computed against.
1. Resolve TARGET to tests and run them in the sandbox; if none fails there is nothing to fix.
2. Run the whole suite once, so "nothing that passed before now fails" can be checked.
3. Run the agent loop on the failure. Then every process in the sandbox is killed, the files
   that changed are read back and the patch is made on the host (``patch.diff``), whatever the
   outcome.
4. In a fresh sandbox made exactly the patched tree (:mod:`clover_agent.fix.verify`), re-run the
   target, then the whole suite, and judge (:mod:`clover_agent.fix.verdict`: fixed; fixed, suite
   unverified; tests weakened; not fixed).

A stopped run (a spent budget, an interrupt, a backend outage) continues with ``resume=``: steps 1
and 2 are taken from its trajectory (the baseline is the repository before the agent worked), the
workspace is restored in a fresh sandbox (the host's snapshot is taken before that, so the patch
holds the earlier segments' work too), and the agent carries on with the recorded conversation
and a fresh budget, appending to the same trajectory after a ``TaskResumed`` event; then step 4.

This is the entry point every front end of the workflow calls (``clover-agent fix``, the CI bot):
:func:`run_fix` with a :class:`FixRequest` holding a complete sandbox spec, a backend factory (called
only once a failure is confirmed) and, optionally, the run folder. Everything lands in that folder
(default ``<repo>/.clover/runs/<id>/``): ``trajectory.jsonl`` (every event), ``patch.diff`` (the
host's diff, whatever the outcome), ``summary.json`` and, until the caller hands the patch back
(:mod:`clover_agent.fix.handback`) or discards it, the shadow repository with the exact bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import Agent, RunResult
from clover_agent.agent.policy import Policy
from clover_agent.agent.system_prompt import gather_facts, system_prompt
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, ExitCode, exit_code_for, message_of
from clover_agent.events import (
    Done,
    ErrorReported,
    EventBus,
    PhaseStarted,
    TaskFinished,
    TaskResumed,
    TaskStarted,
    TestsRun,
)
from clover_agent.fix.patches import is_test_file
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.runs import new_run_id, runs_dir
from clover_agent.fix.stock import HandBackError, PatchSet, Stock
from clover_agent.fix.targets import TestSelection, select_tests
from clover_agent.fix.verdict import FIXED, FIXED_UNVERIFIED, NOT_FIXED
from clover_agent.fix.verify import verify_patch
from clover_agent.sandboxes import SandboxSpec, create_sandbox
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, run_tests_in

PATCH_FILE = "patch.diff"
SUMMARY_FILE = "summary.json"


class NothingToFix(CloverError):
    exit_code = ExitCode.NOTHING_TO_FIX


@dataclass
class FixRequest:
    """One ``fix`` run: TARGET in ``repo``, with everything the workflow needs handed in."""

    target: str
    repo: Path  # the repository on the host (TARGET's files are looked up there)
    make_backend: Callable[[], ModelBackend]  # called only once a failure is confirmed
    sandbox: SandboxSpec  # complete (``clover_agent.launch.sandbox_spec``)
    sandbox_kind: str = "docker"
    run_dir: Path | None = None  # where the run's files go; default <repo>/.clover/runs/<run id>
    command: str = "fix"  # the front end, as the trajectory's task events name it
    policy: Policy | None = None
    approvals: Approvals | None = None  # who answers what the policy asks about (None: no one)
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    suite_timeout_s: float = DEFAULT_TIMEOUT_S  # each whole-suite run (before and after)
    launch: dict[str, Any] = field(default_factory=dict)  # how the front end was started (recorded)
    keep_stream: bool = False  # also keep the streamed text and provisional blocks in the trajectory


@dataclass
class FixReport:
    run_id: str
    run_dir: Path
    exit_code: ExitCode = ExitCode.FAILURE
    message: str = ""
    selection: str = ""
    target_before: TestReport | None = None
    suite_before: TestReport | None = None
    target_after: TestReport | None = None
    suite_after: TestReport | None = None
    regressions: list[str] = field(default_factory=list)
    agent: RunResult | None = None
    backend: str = ""
    files_changed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: What became of the patch in the user's working tree (set by the caller that hands it back):
    #: None until then, e.g. "applied", "dry run", "declined", "refused: <why>".
    hand_back: str | None = None
    #: The verdict (:mod:`clover_agent.fix.verdict`): "fixed", "fixed, suite unverified", "tests
    #: weakened", "not fixed"; "" when the run ended before one (the exit code says why).
    verdict: str = ""
    still_failing: list[str] = field(default_factory=list)  # failed before and after the change
    unverified: list[str] = field(default_factory=list)  # why the suite's run is not a full check
    weakened: list[str] = field(default_factory=list)  # how the target's tests were weakened
    target_not_passing: dict[str, str] = field(default_factory=dict)
    #: The patch made on the host (None when the workspace could not be read back).
    patch_set: PatchSet | None = None
    stock: Stock | None = None

    @property
    def fixed(self) -> bool:
        """The patch makes the target pass (the suite's check may be incomplete: see ``verdict``)."""
        return self.verdict in (FIXED, FIXED_UNVERIFIED)

    @property
    def left_out(self) -> dict[str, str]:
        return {} if self.patch_set is None else self.patch_set.left_out

    @property
    def patch_path(self) -> Path:
        return self.run_dir / PATCH_FILE

    @property
    def trajectory_path(self) -> Path:
        return self.run_dir / TRAJECTORY_FILE

    @property
    def test_files_changed(self) -> list[str]:
        return [f for f in self.files_changed if is_test_file(f)]

    def to_dict(self) -> dict[str, Any]:
        def counts(report: TestReport | None) -> dict[str, Any] | None:
            if report is None:
                return None
            return {k: getattr(report, k) for k in ("passed", "failed", "errors", "skipped", "outcomes")}

        return {
            "run_id": self.run_id,
            "fixed": self.fixed,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "target": self.selection,
            "tests": {
                "target_before": counts(self.target_before),
                "suite_before": counts(self.suite_before),
                "target_after": counts(self.target_after),
                "suite_after": counts(self.suite_after),
            },
            "verdict": self.verdict,
            "regressions": self.regressions,
            "still_failing": self.still_failing,
            "unverified": self.unverified,
            "weakened": self.weakened,
            "target_not_passing": self.target_not_passing,
            "files_changed": self.files_changed,
            "test_files_changed": self.test_files_changed,
            "changes": [] if self.patch_set is None else self.patch_set.to_dict()["changes"],
            "left_out": self.left_out,
            "agent": None
            if self.agent is None
            else {"outcome": self.agent.outcome, "summary": self.agent.summary, **self.agent.stats},
            "backend": self.backend,
            "elapsed_s": round(self.elapsed_s, 3),
            "hand_back": self.hand_back,
            "patch": str(self.patch_path),
            "trajectory": str(self.trajectory_path),
        }

    def write_summary(self) -> dict[str, Any]:
        """Write ``summary.json`` (again, once the patch was handed back); returns what was written."""
        summary = self.to_dict()
        (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def task_text(selection: TestSelection) -> str:
    report = selection.report
    failing = [t for t, outcome in report.outcomes.items() if outcome in ("failed", "error")]
    shown = ", ".join(failing[:10]) + (f" and {len(failing) - 10} more" if len(failing) > 10 else "")
    return (
        f"Make the failing tests pass: {shown or selection.target}.\n\n"
        f"They were selected with `run_tests` target `{selection.target}`. The run right now:\n\n"
        f"{report.summary()}\n\n"
        "Find and fix the cause in the code under test; do not weaken, skip or delete tests. The rest of "
        "the suite must keep passing. When the tests pass, call `finish` with a short summary of the change."
    )


async def run_fix(request: FixRequest, bus: EventBus, *, resume: StoppedRun | None = None) -> FixReport:
    """The whole workflow (see the module docstring); ``resume`` continues that stopped run. Never
    raises any layer's error (:data:`~clover_agent.errors.RUN_ERRORS`) once the run folder exists: failures end up in the report, the
    summary file and the trajectory, whose last event is a ``TaskFinished`` holding the same verdict
    and exit code as the summary file."""
    started = time.monotonic()
    run_id = resume.run_id if resume else new_run_id()
    if resume is not None:
        run_dir = resume.run_dir
    elif request.run_dir is not None:
        run_dir = request.run_dir
    else:
        run_dir = runs_dir(request.repo) / run_id
    report = FixReport(run_id, run_dir)
    writer = TrajectoryWriter(report.trajectory_path, keep_stream=request.keep_stream)
    unsubscribe = bus.subscribe(writer)
    if resume is None:
        bus.emit(
            TaskStarted(
                run_id=run_id,
                command=request.command,
                target=request.target,
                repo=str(request.repo),
                sandbox=request.sandbox_kind,
                launch=request.launch,
            )
        )
    else:
        bus.emit(
            TaskResumed(
                run_id=run_id,
                command=request.command,
                segment=resume.segments + 1,
                previous_exit_code=resume.exit_code,
                previous_outcome=resume.outcome,
                previous_message=resume.message,
                repo=str(request.repo),
                sandbox=request.sandbox_kind,
                launch=request.launch,
            )
        )
    try:
        await _fix(request, bus, report, resume)
    except RUN_ERRORS as exc:
        report.exit_code, report.message = exit_code_for(exc), message_of(exc)
        outcome = "nothing_to_fix" if isinstance(exc, NothingToFix) else "error"
        code = int(report.exit_code)
        bus.emit(ErrorReported(kind=outcome, message=report.message, fatal=True, exit_code=code))
        if report.agent is None:  # the loop emits its own Done
            bus.emit(Done(outcome=outcome, exit_code=code, message=report.message))
    except (asyncio.CancelledError, KeyboardInterrupt):
        report.exit_code, report.message = ExitCode.INTERRUPTED, "interrupted"
        raise
    finally:
        report.elapsed_s = time.monotonic() - started
        summary = report.write_summary()
        # The last line of the trajectory is the task's verdict, the same as the summary file's.
        bus.emit(
            TaskFinished(
                run_id=run_id,
                command=request.command,
                exit_code=int(report.exit_code),
                message=report.message,
                report=summary,
            )
        )
        await bus.drain()
        unsubscribe()
        writer.close()
    return report


async def _fix(request: FixRequest, bus: EventBus, report: FixReport, resume: StoppedRun | None) -> None:
    report.stock = stock = Stock(report.run_dir, request.repo)
    spec = request.sandbox
    if spec.progress is None:  # the sandbox's set-up steps (an environment built once) go on the bus
        spec = dataclasses.replace(
            spec, progress=lambda detail: bus.emit(PhaseStarted(phase="set-up", detail=detail))
        )
    bus.emit(PhaseStarted(phase="set-up", detail=f"starting the {request.sandbox_kind} sandbox"))
    sandbox = create_sandbox(request.sandbox_kind, spec)
    async with sandbox:
        await stock.record_start(sandbox)  # before any test or the agent ran
        if resume is None:
            selection = await _reproduce(request, sandbox, bus, report)
            target_tests = selection.target
        else:
            report.selection, target_tests = resume.selection, resume.target_tests
            report.target_before, report.suite_before = resume.target_before, resume.suite_before

        backend = request.make_backend()
        report.backend = backend.name
        try:
            agent = Agent(
                backend,
                sandbox,
                bus,
                run_id=report.run_id,
                policy=request.policy,
                approvals=request.approvals,
                budget=Budget(request.max_steps, request.max_time_s, request.max_tokens),
            )
            if resume is None:
                facts = await gather_facts(sandbox)
                report.agent = await agent.run(task_text(selection), system_prompt(facts))
            else:  # the system prompt and the task are in the recorded conversation
                report.agent = await agent.run(resume.state.task, "", resume=resume.state, fresh_budget=True)
        finally:
            await backend.close()
        await _keep_patch(sandbox, report)
    if report.agent.submitted and report.patch_set is not None:
        await _verify(request, bus, report, target_tests)
    elif report.agent.submitted:  # the workspace could not be read back: nothing can be handed back
        report.verdict, report.exit_code = NOT_FIXED, ExitCode.SANDBOX_UNAVAILABLE
    else:
        report.exit_code, report.message = report.agent.exit_code, report.agent.message


async def _keep_patch(sandbox: Sandbox, report: FixReport) -> None:
    """Step 3's end: the host's patch (every process killed first), kept in ``patch.diff``."""
    assert report.stock is not None and report.agent is not None
    try:
        patch = await report.stock.record_end(sandbox)
    except (*RUN_ERRORS, OSError) as exc:
        report.patch_path.write_bytes(b"")
        report.message = f"the workspace could not be read back from the sandbox: {message_of(exc)}"
        if not report.agent.submitted:
            report.message = f"{report.agent.message} ({report.message})"
        return
    report.patch_set = patch
    report.patch_path.write_bytes(patch.patch)
    report.files_changed = patch.files


async def _verify(request: FixRequest, bus: EventBus, report: FixReport, target_tests: str) -> None:
    """Step 4: the target and the suite on the exact patched tree, in a fresh sandbox; the verdict."""
    assert report.patch_set is not None and report.stock is not None
    assert report.target_before is not None and report.suite_before is not None

    async def suite(sandbox: Sandbox) -> TestReport:
        return await run_tests_in(sandbox, None, timeout=request.suite_timeout_s)

    try:
        checked = await verify_patch(
            request.sandbox,
            request.sandbox_kind,
            report.stock,
            report.patch_set,
            target_tests=target_tests,
            target_before=report.target_before,
            suite_before=report.suite_before,
            bus=bus,
            run_suite=suite,
        )
    except HandBackError as exc:
        report.verdict, report.exit_code, report.message = NOT_FIXED, ExitCode.FAILURE, exc.message
        return
    report.target_after, report.suite_after = checked.target_after, checked.suite_after
    j = checked.judgement
    report.verdict, report.exit_code, report.message = j.verdict, j.exit_code, j.message
    report.regressions, report.still_failing, report.unverified = j.regressions, j.still_failing, j.unverified
    report.weakened, report.target_not_passing = j.weakened, j.target_not_passing
    if report.left_out and report.fixed:
        report.message += (
            f" ({len(report.left_out)} change(s) left out of the patch: {', '.join(report.left_out)})"
        )


async def _reproduce(
    request: FixRequest, sandbox: Sandbox, bus: EventBus, report: FixReport
) -> TestSelection:
    """Steps 1 and 2: the target's failure confirmed, and the suite's baseline."""
    bus.emit(
        PhaseStarted(phase="tests before", detail=f"finding and running the tests {request.target!r} selects")
    )
    selection = await select_tests(sandbox, request.target, request.repo)
    report.selection, report.target_before = f"{selection.target} ({selection.how})", selection.report
    bus.emit(TestsRun(phase="target_before", target=selection.target, report=selection.report.to_dict()))
    if selection.report.all_passed:
        total = selection.report.total
        raise NothingToFix(
            f"nothing to fix: {request.target!r} selects {total} test{'' if total == 1 else 's'} and none fails "
            f"({selection.report.passed} passed, {selection.report.skipped} skipped)"
        )
    if selection.report.problem and not selection.report.outcomes:
        raise CloverError(f"the target tests could not be run: {selection.report.problem}")
    bus.emit(PhaseStarted(phase="tests before", detail="running the whole suite (the baseline)"))
    report.suite_before = await run_tests_in(sandbox, None, timeout=request.suite_timeout_s)
    bus.emit(TestsRun(phase="suite_before", target="", report=report.suite_before.to_dict()))
    return selection
