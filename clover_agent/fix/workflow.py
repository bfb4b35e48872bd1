"""The ``fix`` workflow: reproduce a failing test, let the agent repair it, verify, keep the patch.

0. Right after the sandbox starts, the host takes its own snapshot of the workspace
   (:mod:`clover_agent.fix.handback.stock`): the starting state the patch is computed against.
1. Resolve TARGET to tests and run them in the sandbox; if none fails there is nothing to fix; if
   they cannot run in the sandbox's environment (:mod:`clover_agent.fix.diagnosis`), the run
   stops here (exit 4), before any agent.
2. Run the regression baseline once (:mod:`clover_agent.fix.regression`: the whole suite by
   default, or the related test files, or nothing), so "nothing that passed before now fails" can
   be checked.
3. Run the agent loop on the failure. Then every process in the sandbox is killed, the files
   that changed are read back and the patch is made on the host (``patch.diff``), whatever the
   outcome.
4. In a fresh sandbox made exactly the patched tree (:mod:`clover_agent.fix.handback.verify`), re-run the
   target, then the same regression tests, and judge (:mod:`clover_agent.fix.handback.verdict`: fixed; fixed, suite
   unverified; tests weakened; not fixed).

A front end with a request from a user (the CI bot) puts it before the task (``request``) and may
leave TARGET empty: the suite runs first and its failing tests are the target. When none fails,
the agent works from the request alone, and success also needs a test the patch adds or changes
that fails without the change and passes with it (:mod:`clover_agent.fix.handback.evidence`).

A stopped run (a spent budget, an interrupt, a backend outage) continues with ``resume=``: steps 1
and 2 are taken from its trajectory (the baseline is the repository before the agent worked), the
workspace is restored in a fresh sandbox (the host's snapshot is taken before that, so the patch
holds the earlier segments' work too), and the agent carries on with the recorded conversation
and a fresh budget, appending to the same trajectory after a ``TaskResumed`` event; then step 4.

This is the entry point every front end of the workflow calls (``clover-agent fix``, the CI bot):
:func:`run_fix` with a :class:`FixRequest` holding a complete sandbox spec, a backend factory (called
only once a failure is confirmed) and, optionally, the run folder. Everything lands in that folder
(default ``<repo>/.clover/runs/<id>/``): ``trajectory.jsonl`` (every event), ``patch.diff`` (the
host's diff, whatever the outcome), ``summary.json`` (each signed with ``record_key``: :mod:`clover_agent.agent.records`) and, until the caller hands the patch back
(:mod:`clover_agent.fix.handback.decision`) or discards it, the shadow repository with the exact bytes.

(Over 400 lines: the workflow's steps, for a target and for a request with none, read in one place.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import Agent, RunResult
from clover_agent.agent.policy import Policy
from clover_agent.agent.records import RecordKey
from clover_agent.agent.system_prompt import gather_facts, system_prompt
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, ExitCode, UsageError, exit_code_for, message_of
from clover_agent.events import (
    Done,
    ErrorReported,
    EventBus,
    PhaseStarted,
    SandboxProgress,
    TaskFinished,
    TaskResumed,
    TaskStarted,
    TestsRun,
)
from clover_agent.fix.diagnosis import diagnose, workspace_module_names
from clover_agent.fix.handback import evidence
from clover_agent.fix.handback.patches import hidden_work, is_test_file
from clover_agent.fix.handback.stock import SHADOW_DIR, HandBackError, PatchSet, Stock
from clover_agent.fix.handback.verdict import FIXED, FIXED_UNVERIFIED, NOT_FIXED
from clover_agent.fix.handback.verify import verify_patch
from clover_agent.fix.regression import (
    DEFAULT_SCOPE,
    NO_REGRESSION_RUN,
    WORKERS,
    regression_skipped,
    select_regression,
    skipped_regression_report,
)
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.runs import PATCH_FILE, SUMMARY_FILE, new_run_id, runs_dir
from clover_agent.fix.targets import TestSelection, select_tests, target_for
from clover_agent.sandboxes import SandboxSpec, create_sandbox
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, run_tests_in


class NothingToFix(CloverError):
    exit_code = ExitCode.NOTHING_TO_FIX


@dataclass
class FixRequest:
    """One ``fix`` run: TARGET in ``repo``, with everything the workflow needs handed in."""

    target: str  # "": the tests that fail in the whole suite (or, with a ``request``, none)
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
    regression: str = DEFAULT_SCOPE  # what the regression runs cover (clover_agent.fix.regression)
    #: The user's request, as the front end framed it for the model, put before the task.
    request: str = ""
    launch: dict[str, Any] = field(default_factory=dict)  # how the front end was started (recorded)
    keep_stream: bool = False  # also keep the streamed text and provisional blocks in the trajectory
    #: Signs the run's records (``fix --resume`` and ``runs`` read only signed ones); None: unsigned
    #: (the CI bot's output folder, which nothing reads back).
    record_key: RecordKey | None = None


class EnvironmentNotReady(CloverError):
    """The target cannot run in the sandbox's environment (named by :mod:`clover_agent.fix.diagnosis`)."""

    exit_code = ExitCode.SANDBOX_UNAVAILABLE


@dataclass
class FixReport:
    run_id: str
    run_dir: Path
    exit_code: ExitCode = ExitCode.FAILURE
    message: str = ""
    #: How the tests to fix were chosen: "target" (TARGET), "failing tests" (the suite's), or
    #: "request" (none failed: the change is the request's); "" until known.
    mode: str = ""
    selection: str = ""
    target_before: TestReport | None = None
    suite_before: TestReport | None = None
    target_after: TestReport | None = None  # held out: the starting commit's tests
    suite_after: TestReport | None = None  # held out
    #: The target, and the test files the patch adds or changes, on the patch as handed back; None
    #: when the patch changes nothing the held-out run puts back (the same tree).
    target_handed_back: TestReport | None = None
    tests_handed_back: TestReport | None = None
    #: What the patch changes in what judges it (named whatever the verdict), and the paths the
    #: held-out run put back.
    harness: list[str] = field(default_factory=list)
    tests_changed: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    #: Working from a request with no failing test: the changed tests run on the starting code with
    #: only the patch's test files, and the tests that pass with the change and not without it.
    without_change: TestReport | None = None
    shown_by: list[str] = field(default_factory=list)
    agent: RunResult | None = None
    backend: str = ""
    files_changed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: What became of the patch in the user's working tree (set by the caller that hands it back):
    #: None until then, e.g. "applied", "dry run", "declined", "refused: <why>".
    hand_back: str | None = None
    #: The verdict (:mod:`clover_agent.fix.handback.verdict`): "fixed", "fixed, suite unverified", "tests
    #: weakened", "not fixed"; "" when the run ended before one (the exit code says why).
    verdict: str = ""
    still_failing: list[str] = field(default_factory=list)  # failed before and after the change
    unverified: list[str] = field(default_factory=list)  # why the suite's run is not a full check
    weakened: list[str] = field(default_factory=list)  # how the target's tests were weakened
    target_not_passing: dict[str, str] = field(default_factory=dict)
    #: The patch made on the host (None when the workspace could not be read back).
    patch_set: PatchSet | None = None
    stock: Stock | None = None
    key: RecordKey | None = None  # signs the RECORD_FILES

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
            "mode": self.mode,
            "target": self.selection,
            "tests": {
                "target_before": counts(self.target_before),
                "suite_before": counts(self.suite_before),
                "target_after": counts(self.target_after),
                "suite_after": counts(self.suite_after),
                "target_handed_back": counts(self.target_handed_back),
                "tests_handed_back": counts(self.tests_handed_back),
                "without_change": counts(self.without_change),
            },
            "harness": self.harness,
            "tests_changed": self.tests_changed,
            "verdict": self.verdict,
            "regressions": self.regressions,
            "still_failing": self.still_failing,
            "unverified": self.unverified,
            "weakened": self.weakened,
            "target_not_passing": self.target_not_passing,
            "shown_by": self.shown_by,
            "files_changed": self.files_changed,
            "test_files_changed": self.test_files_changed,
            "changes": [] if self.patch_set is None else self.patch_set.to_dict()["changes"],
            "left_out": self.left_out,
            "needs_yes": {} if self.patch_set is None else self.patch_set.to_dict()["needs_yes"],
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
        if self.key is not None:
            for name in (SUMMARY_FILE, PATCH_FILE):
                if (self.run_dir / name).is_file():
                    self.key.sign(self.run_dir, name)
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
    report = FixReport(run_id, run_dir, key=request.record_key)
    if resume is not None:  # a killed segment's shadow repository: the run makes its own
        shutil.rmtree(run_dir / SHADOW_DIR, ignore_errors=True)
    writer = TrajectoryWriter(report.trajectory_path, keep_stream=request.keep_stream, key=report.key)
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
    def progress(message: str) -> None:
        bus.emit(SandboxProgress(message=message))

    # the environment's set-up and a large copy say what they do (here and in the verifying sandbox)
    request = dataclasses.replace(request, sandbox=dataclasses.replace(request.sandbox, progress=progress))
    report.stock = stock = Stock(report.run_dir, request.repo)
    hidden = hidden_work(request.repo)
    if hidden:  # git hides their changes from `status`; the apply's guard still sees them
        shown = ", ".join(f"{path} ({flag})" for path, flag in list(hidden.items())[:10])
        more = f" and {len(hidden) - 10} more" if len(hidden) > 10 else ""
        bus.emit(
            ErrorReported(
                kind="your tree",
                message=f"{shown}{more}: marked so git hides their changes; they count as your own work, "
                "and a patch that changes them is not applied",
            )
        )
    bus.emit(PhaseStarted(phase="set-up", detail=f"starting the {request.sandbox_kind} sandbox"))
    sandbox = create_sandbox(request.sandbox_kind, request.sandbox)
    async with sandbox:
        await stock.record_start(sandbox)  # before any test or the agent ran
        if resume is None:
            selection = await _reproduce(request, sandbox, bus, report)
            target_tests = selection.target if selection else ""  # "": from the request alone
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
                assert report.suite_before is not None
                own = task_text(selection) if selection else evidence.request_task_text(report.suite_before)
                task = f"{request.request}\n\n{own}" if request.request else own
                report.agent = await agent.run(task, system_prompt(facts))
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
    """Step 4: the target and the suite on the exact patched tree, in a fresh sandbox; the verdict.
    An empty ``target_tests`` (working from the request alone): the test files the patch adds or
    changes are the target, and one of them must fail without the change (:func:`_show_change`)."""
    assert report.patch_set is not None and report.stock is not None and report.suite_before is not None
    from_request = not target_tests
    target_before = report.target_before
    if from_request:
        target_tests = " ".join(evidence.test_files(report.patch_set))
        if not target_tests:
            report.verdict, report.exit_code = NOT_FIXED, ExitCode.FAILURE
            report.message = (
                "no test shows the change: the patch adds or changes no test file (with no failing test, "
                "a test that fails without the change and passes with it is needed)"
            )
            return
        # Nothing failed before: the new tests' baseline is their run without the change, below.
        framework = report.suite_before.framework
        target_before = TestReport(framework=framework, command="", target=target_tests, exit_code=0)
    assert target_before is not None

    async def suite(sandbox: Sandbox) -> TestReport:
        if regression_skipped(report.suite_before):  # --regression none: nothing to run again
            return skipped_regression_report()
        # the same tests as the baseline: the whole suite, or the related files it ran
        return await run_tests_in(
            sandbox,
            report.suite_before.target,
            timeout=request.suite_timeout_s,
            workers=WORKERS,
            guarded=True,
            framework=report.suite_before.framework,
        )

    try:
        checked = await verify_patch(
            request.sandbox,
            request.sandbox_kind,
            report.stock,
            report.patch_set,
            target_tests=target_tests,
            target_before=target_before,
            suite_before=report.suite_before,
            bus=bus,
            run_suite=suite,
            keep_tests=frozenset(target_tests.split()) if from_request else frozenset(),
        )
    except HandBackError as exc:
        report.verdict, report.exit_code, report.message = NOT_FIXED, ExitCode.FAILURE, exc.message
        return
    report.target_after, report.suite_after = checked.target_after, checked.suite_after
    if checked.handed_back is not None:
        report.target_handed_back, report.tests_handed_back = (
            checked.handed_back.target,
            checked.handed_back.tests,
        )
    report.harness = checked.harness
    j = checked.judgement
    report.tests_changed = j.tests_changed
    report.verdict, report.exit_code, report.message = j.verdict, j.exit_code, j.message
    report.regressions, report.still_failing, report.unverified = j.regressions, j.still_failing, j.unverified
    report.weakened, report.target_not_passing = j.weakened, j.target_not_passing
    if regression_skipped(report.suite_before) and j.verdict == FIXED_UNVERIFIED:
        report.unverified = [NO_REGRESSION_RUN]
        report.message = f"the target passes; the rest of the suite was not checked ({NO_REGRESSION_RUN})"
    elif report.suite_before.target and j.verdict == FIXED:
        files = len(set(report.suite_before.target.split()))
        report.message += f" in the {files} related test file(s) checked (--regression related)"
    if from_request and report.fixed:
        await _show_change(request, bus, report, target_tests)
    if report.left_out and report.fixed:
        report.message += (
            f" ({len(report.left_out)} change(s) left out of the patch: {', '.join(report.left_out)})"
        )


async def _show_change(request: FixRequest, bus: EventBus, report: FixReport, target_tests: str) -> None:
    """The verdict for a change made from the request alone: a changed test must fail without it."""
    assert report.patch_set is not None and report.target_after is not None
    try:
        without = await evidence.run_without_change(
            request.sandbox_kind, request.sandbox, report.patch_set, target_tests
        )
    except HandBackError as exc:
        report.verdict, report.exit_code, report.message = NOT_FIXED, ExitCode.FAILURE, exc.message
        return
    report.without_change = without
    bus.emit(TestsRun(phase="without_change", target=target_tests, report=without.to_dict()))
    report.shown_by = evidence.shown_by(report.target_after, without)
    if not report.shown_by:
        report.verdict, report.exit_code = NOT_FIXED, ExitCode.FAILURE
        report.message = f"no test shows the change: the tests in {target_tests} pass without it too" + (
            " (the run without the change timed out)" if without.timed_out else ""
        )
        return
    shown = ", ".join(report.shown_by[:5]) + (" ..." if len(report.shown_by) > 5 else "")
    done = f"done: {shown} fails without the change and passes with it"
    # A verdict of FIXED_UNVERIFIED keeps its exit code and says why.
    report.message = (
        f"{done}, and nothing else broke" if report.verdict == FIXED else f"{done}; {report.message}"
    )


async def _reproduce(
    request: FixRequest, sandbox: Sandbox, bus: EventBus, report: FixReport
) -> TestSelection | None:
    """Steps 1 and 2: the target's failure confirmed (an environment problem stops the run here,
    before any agent), and the regression baseline (one run; free text's suite run is reused).
    None: no TARGET and no test fails; the agent works from the request."""
    if not request.target:
        return await _failing_in_suite(request, sandbox, bus, report)
    report.mode = "target"
    bus.emit(
        PhaseStarted(phase="tests before", detail=f"finding and running the tests {request.target!r} selects")
    )
    selection = await select_tests(
        sandbox, request.target, request.repo, workers=WORKERS, suite_timeout=request.suite_timeout_s
    )
    report.selection, report.target_before = f"{selection.target} ({selection.how})", selection.report
    bus.emit(TestsRun(phase="target_before", target=selection.target, report=selection.report.to_dict()))
    if selection.report.all_passed:
        total = selection.report.total
        raise NothingToFix(
            f"nothing to fix: {request.target!r} selects {total} test{'' if total == 1 else 's'} and none fails "
            f"({selection.report.passed} passed, {selection.report.skipped} skipped)"
        )
    await _check_environment(request, sandbox, selection.report, request.target)
    if selection.report.problem and not selection.report.outcomes:
        raise CloverError(f"the target tests could not be run: {selection.report.problem}")
    chosen = await select_regression(sandbox, request.regression, list(selection.report.outcomes))
    if not chosen.runs:
        report.suite_before = skipped_regression_report()
    elif chosen.target is None and selection.suite is not None:
        report.suite_before = selection.suite  # the suite run free text needed: the same phase
    else:
        bus.emit(PhaseStarted(phase="tests before", detail=f"the regression baseline: {chosen.describe()}"))
        report.suite_before = await run_tests_in(
            sandbox, chosen.target, timeout=request.suite_timeout_s, workers=WORKERS
        )
    bus.emit(TestsRun(phase="suite_before", target=chosen.target or "", report=report.suite_before.to_dict()))
    return selection


async def _check_environment(request: FixRequest, sandbox: Sandbox, report: TestReport, target: str) -> None:
    """:class:`EnvironmentNotReady` when the target's failure is the environment's (a module not
    installed, a fixture's plugin missing), not a bug for the agent."""
    problem = diagnose(
        report,
        await workspace_module_names(sandbox),
        environment=request.sandbox.environment is not None and request.sandbox_kind == "docker",
    )
    if problem is not None:
        raise EnvironmentNotReady(problem.message(target))


async def _failing_in_suite(
    request: FixRequest, sandbox: Sandbox, bus: EventBus, report: FixReport
) -> TestSelection | None:
    """No TARGET: the suite runs first and the tests failing in it are the target; when none fails,
    None (the request alone says what to do) or, without a request, nothing to fix."""
    suite = report.suite_before = await run_tests_in(
        sandbox, None, timeout=request.suite_timeout_s, workers=WORKERS
    )
    bus.emit(TestsRun(phase="suite_before", target="", report=suite.to_dict()))
    failing = [t for t, outcome in suite.outcomes.items() if outcome in ("failed", "error")]
    if failing:
        target, report.mode = target_for(failing), "failing tests"
        selection = TestSelection(target, "failing in the suite", await run_tests_in(sandbox, target))
        report.selection, report.target_before = f"{selection.target} ({selection.how})", selection.report
        bus.emit(TestsRun(phase="target_before", target=selection.target, report=selection.report.to_dict()))
        await _check_environment(request, sandbox, selection.report, selection.target)
        return selection
    if not suite.outcomes:
        why = suite.problem or suite.summary()
        raise UsageError(f"found no tests in {request.repo} ({why}); a change is checked with the tests")
    if not suite.all_passed:
        raise CloverError(f"the suite could not be run as it is: {suite.problem or suite.summary()}")
    if not request.request:
        raise NothingToFix(f"nothing to fix: no test fails ({suite.passed} passed, {suite.skipped} skipped)")
    report.mode, report.selection = "request", "none: no test fails, the change is the request's"
    return None
