"""The ``fix`` workflow: reproduce a failing test, let the agent repair it, verify, keep the patch.

:func:`run_fix` is what every front end of the workflow calls (``clover-agent fix``, the CI bot)
with a :class:`FixRequest`: a complete sandbox spec, a backend factory (called only once a failure
is confirmed) and, optionally, the run folder. The steps (docs/architecture.md, "The fix
workflow's steps"): the host's snapshot of the start, TARGET resolved and run, the regression
baseline, the agent, the patch made on the host, its verification in a fresh sandbox and the
verdict (:mod:`clover_agent.handback`); a request with no failing test needs a test that shows
the change, and a stopped run continues with ``resume=``. Each step returns a value
(:mod:`clover_agent.fix.report`) and the frozen report is built once from them, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.loop import RunResult
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
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
from clover_agent.fix.regression import DEFAULT_SCOPE, select_regression
from clover_agent.fix.report import Before, FixReport, Kept, Mode, build_report, write_summary
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.runs import PATCH_FILE, new_run_id, runs_dir
from clover_agent.fix.targets import TestSelection, means_failing_now, select_tests, target_for
from clover_agent.handback import evidence
from clover_agent.handback.diagnosis import diagnose, workspace_module_names
from clover_agent.handback.judging import WORKERS, Checked, Judging, check_patch
from clover_agent.handback.patches import hidden_work
from clover_agent.handback.stock import SHADOW_DIR, PatchSet, Stock
from clover_agent.handback.verdict import Judgement, Verdict, skipped_regression_report
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.errors import SandboxError
from clover_agent.session.assembly import AgentSession, SessionConfig
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, default_test_timeout, run_tests_in


class NothingToFix(CloverError):
    exit_code = ExitCode.NOTHING_TO_FIX


@dataclass
class FixRequest:
    """One ``fix`` run: an agent session (:class:`~clover_agent.session.assembly.SessionConfig`:
    repository, model, sandbox, policy, budget, record key, MCP servers) and what is ``fix``'s own.
    The session's backend is made only once a failure is confirmed; its ``max_time_s`` is the
    agent's budget, or the whole run's deadline with ``whole_run_time``."""

    target: str  # "": the tests that fail in the whole suite (or, with a ``request``, none)
    session: SessionConfig
    run_dir: Path | None = None  # where the run's files go; default <repo>/.clover/runs/<run id>
    command: str = "fix"  # the front end, as the trajectory's task events name it
    approvals: Approvals | None = None  # who answers what the policy asks about (None: no one)
    #: ``session.max_time_s`` is the whole run's wall-clock deadline (the CI bot's): it counts from
    #: the run's start, and the reproduction, the agent's tool calls and the verification are cut at it.
    whole_run_time: bool = False
    #: Exit codes the front end gives otherwise (the CI bot's 7 -> 1), in the summary and the
    #: trajectory's verdict alike.
    exit_codes: dict[int, int] = field(default_factory=dict)
    suite_timeout_s: float = DEFAULT_TIMEOUT_S  # each whole-suite run (before and after)
    #: Each test's own limit in every run (a test past it fails alone); None: a fifth of the suite's.
    test_timeout_s: float | None = None
    regression: str = DEFAULT_SCOPE  # what the regression runs cover (clover_agent.fix.regression)
    #: The user's request, as the front end framed it for the model, put before the task.
    request: str = ""
    launch: dict[str, Any] = field(default_factory=dict)  # how the front end was started (recorded)
    keep_stream: bool = False  # also keep the streamed text and provisional blocks in the trajectory


def per_test_limit(request: FixRequest) -> float:
    """Each test's own limit in the request's runs (``--test-timeout``, else a fifth of the suite's)."""
    return request.test_timeout_s or default_test_timeout(request.suite_timeout_s)


class EnvironmentNotReady(CloverError):
    """The target cannot run in the sandbox's environment (named by :mod:`clover_agent.handback.diagnosis`)."""

    exit_code = ExitCode.SANDBOX_UNAVAILABLE


@dataclass
class _Found:
    """What the phases returned so far, each set once by :func:`_fix`; the report is built from it
    on every way out of :func:`run_fix`."""

    stock: Stock | None = None
    before: Before | None = None
    backend: str = ""
    agent: RunResult | None = None
    kept: Kept | None = None
    checked: Checked | None = None
    deadline: float | None = None  # the whole run's (``FixRequest.whole_run_time``), monotonic


@contextlib.asynccontextmanager
async def _by_deadline(deadline: float | None, doing: str) -> AsyncIterator[None]:
    """What runs inside is cut at ``deadline`` (a ``time.monotonic()``; None: never), and the cut
    is the run's time budget spent, ``doing`` that."""
    if deadline is None:
        yield
        return
    loop = asyncio.get_running_loop()
    timer = asyncio.timeout_at(loop.time() + deadline - time.monotonic())
    try:
        async with timer:
            yield
    except TimeoutError:
        if not timer.expired():
            raise
        raise LimitsExceeded(
            f"time budget exhausted while {doing}: the run's deadline passed (raise --max-time)"
        ) from None


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
        run_dir = runs_dir(request.session.repo) / run_id
    if resume is not None:  # a killed segment's shadow repository: the run makes its own
        shutil.rmtree(run_dir / SHADOW_DIR, ignore_errors=True)
    writer = TrajectoryWriter(
        run_dir / TRAJECTORY_FILE, keep_stream=request.keep_stream, key=request.session.record_key
    )
    unsubscribe = bus.subscribe(writer)
    if resume is None:
        bus.emit(
            TaskStarted(
                run_id=run_id,
                command=request.command,
                target=request.target,
                repo=str(request.session.repo),
                sandbox=request.session.sandbox_kind,
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
                repo=str(request.session.repo),
                sandbox=request.session.sandbox_kind,
                launch=request.launch,
            )
        )
    found = _Found()
    exit_code, message = ExitCode.FAILURE, ""
    if request.whole_run_time and request.session.max_time_s is not None:
        found.deadline = started + request.session.max_time_s
    try:
        exit_code, message = await _fix(request, bus, run_id, run_dir, found, resume)
    except RUN_ERRORS as exc:
        exit_code, message = exit_code_for(exc), message_of(exc)
        outcome = "nothing_to_fix" if isinstance(exc, NothingToFix) else "error"
        bus.emit(ErrorReported(kind=outcome, message=message, fatal=True, exit_code=int(exit_code)))
        if found.agent is None:  # the loop emits its own Done
            bus.emit(Done(outcome=outcome, exit_code=int(exit_code), message=message))
    except (asyncio.CancelledError, KeyboardInterrupt):
        exit_code, message = ExitCode.INTERRUPTED, "interrupted"
        raise
    finally:
        exit_code = ExitCode(request.exit_codes.get(int(exit_code), int(exit_code)))
        report = build_report(
            run_id,
            run_dir,
            exit_code=exit_code,
            message=message,
            elapsed_s=time.monotonic() - started,
            key=request.session.record_key,
            stock=found.stock,
            before=found.before,
            backend=found.backend,
            agent=found.agent,
            kept=found.kept,
            checked=found.checked,
        )
        summary = write_summary(report)
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


async def _fix(
    request: FixRequest, bus: EventBus, run_id: str, run_dir: Path, found: _Found, resume: StoppedRun | None
) -> tuple[ExitCode, str]:
    """The phases, in order, each value kept in ``found``; returns the run's exit code and message."""

    def progress(message: str) -> None:
        bus.emit(SandboxProgress(message=message))

    # the environment's set-up and a large copy say what they do (here and in the verifying sandbox)
    spec = dataclasses.replace(request.session.spec, progress=progress)
    request = dataclasses.replace(request, session=dataclasses.replace(request.session, spec=spec))
    found.stock = stock = Stock(run_dir, request.session.repo)
    hidden = hidden_work(request.session.repo)
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
    bus.emit(PhaseStarted(phase="set-up", detail=f"starting the {request.session.sandbox_kind} sandbox"))
    parts = AgentSession(
        request.session,
        bus,
        run_id=run_id,
        folder=run_dir,
        report=lambda message: bus.emit(ErrorReported(kind="mcp", message=message)),
    )
    try:
        sandbox = await parts.open_sandbox()
        async with _by_deadline(found.deadline, "reproducing the failure"):
            await stock.record_start(sandbox)  # before any test or the agent ran
            found.before = before = (
                await _reproduce(request, sandbox, bus) if resume is None else _resumed(resume)
            )
        if before.stop is not None:
            raise before.stop
        backend = request.session.make_backend()
        found.backend = backend.name
        try:
            budget = Budget(
                request.session.max_steps,
                request.session.max_time_s,
                request.session.max_tokens,
                deadline=found.deadline,
            )
            agent = await parts.open_agent(backend, budget, request.approvals)
            if resume is None:
                task = f"{request.request}\n\n{before.task}" if request.request else before.task
                found.agent = result = await agent.run(task, await parts.system_prompt())
            else:  # the system prompt and the task are in the recorded conversation
                found.agent = result = await agent.run(
                    resume.state.task, "", resume=resume.state, fresh_budget=True
                )
        finally:
            try:
                await parts.close_agent()
            finally:
                await backend.close()
        found.kept = kept = await _keep_patch(sandbox, stock, run_dir / PATCH_FILE)
    finally:
        await parts.close()
    if not result.submitted:
        return result.exit_code, result.message
    if kept.patch_set is None:  # the workspace could not be read back: nothing can be handed back
        found.checked = Checked(Judgement(Verdict.NOT_FIXED, ExitCode.SANDBOX_UNAVAILABLE, kept.problem))
    else:
        async with _by_deadline(found.deadline, "verifying the patch"):
            found.checked = await _verify(request, bus, stock, kept.patch_set, before)
    return found.checked.judged.exit_code, found.checked.judged.message


async def verify_part(request: FixRequest, bus: EventBus, report: FixReport, part: PatchSet) -> Checked:
    """Step 4 again, at the hand-back, for ``part`` of the verified patch (what is to be applied when
    files are left out: :meth:`Stock.subset`): the same runs and checks on exactly those bytes, in
    a fresh sandbox; its verdict is then the run's."""
    assert report.stock is not None and report.before is not None
    bus.emit(
        PhaseStarted(
            phase="verification", detail=f"verifying {len(part.files)} file(s) to apply on their own"
        )
    )
    return await _verify(request, bus, report.stock, part, report.before)


def _resumed(resume: StoppedRun) -> Before:
    """Steps 1 and 2 of a resumed run, from its trajectory."""
    return Before(
        selection=resume.selection,
        target_tests=resume.target_tests,
        target_before=resume.target_before,
        suite_before=resume.suite_before,
    )


async def _keep_patch(sandbox: Sandbox, stock: Stock, patch_path: Path) -> Kept:
    """Step 3's end: the host's patch (every process killed first), kept in ``patch.diff``."""
    try:
        patch = await stock.record_end(sandbox)
    except (*RUN_ERRORS, OSError) as exc:
        patch_path.write_bytes(b"")
        return Kept(None, f"the workspace could not be read back from the sandbox: {message_of(exc)}")
    patch_path.write_bytes(patch.patch)
    return Kept(patch)


def _judging(request: FixRequest, stock: Stock, before: Before) -> Judging:
    """What step 4 judges the patch against: the run's baseline and target (none: the request's)."""
    assert before.suite_before is not None
    return Judging(
        request.session.spec,
        request.session.sandbox_kind,
        stock,
        before.suite_before,
        before.target_tests,
        before.target_before,
        suite_timeout_s=request.suite_timeout_s,
        test_timeout_s=per_test_limit(request),
    )


async def _verify(
    request: FixRequest, bus: EventBus, stock: Stock, patch_set: PatchSet, before: Before
) -> Checked:
    """Step 4: the target and the suite on the exact patched tree, in a fresh sandbox; the verdict
    (:func:`clover_agent.handback.judging.check_patch`, as every front end judges)."""
    return await check_patch(_judging(request, stock, before), patch_set, bus)


async def _reproduce(request: FixRequest, sandbox: Sandbox, bus: EventBus) -> Before:
    """Steps 1 and 2: the target's failure confirmed (an environment problem stops the run here,
    before any agent: ``stop``), and the regression baseline (one run; free text's suite run is
    reused). No TARGET, or one that means the tests failing now: :func:`_failing_in_suite`."""
    if not request.target or means_failing_now(request.target, request.session.repo):
        return await _failing_in_suite(request, sandbox, bus)
    bus.emit(
        PhaseStarted(phase="tests before", detail=f"finding and running the tests {request.target!r} selects")
    )
    selection = await select_tests(
        sandbox,
        request.target,
        request.session.repo,
        workers=WORKERS,
        suite_timeout=request.suite_timeout_s,
        test_timeout=per_test_limit(request),
    )
    seen = Before(Mode.TARGET, f"{selection.target} ({selection.how})", selection.target, selection.report)
    chosen = f"the tests whose names share the most words with {request.target!r}"
    bus.emit(
        TestsRun(
            phase="target_before",
            target=selection.target,
            report=selection.report.to_dict(),
            chosen=chosen if selection.how == "free text" else "",
        )
    )
    try:
        return await _baseline(request, sandbox, bus, selection, seen)
    except SandboxError as exc:  # the sandbox broke after the target's run: that run is kept
        return dataclasses.replace(seen, stop=exc)


async def _baseline(
    request: FixRequest, sandbox: Sandbox, bus: EventBus, selection: TestSelection, seen: Before
) -> Before:
    """Step 2 after the target's run (``seen``): stop when nothing fails or the environment is to
    blame, else the regression baseline."""
    if selection.report.all_passed:
        total = selection.report.total
        return dataclasses.replace(
            seen,
            stop=NothingToFix(
                f"nothing to fix: {request.target!r} selects {total} test{'' if total == 1 else 's'} and none "
                f"fails ({selection.report.passed} passed, {selection.report.skipped} skipped)"
            ),
        )
    problem = await _environment_problem(request, sandbox, selection.report, request.target)
    if problem is not None:
        return dataclasses.replace(seen, stop=problem)
    if selection.report.problem and not selection.report.outcomes:
        return dataclasses.replace(
            seen, stop=CloverError(f"the target tests could not be run: {selection.report.problem}")
        )
    chosen = await select_regression(sandbox, request.regression, list(selection.report.outcomes))
    if not chosen.runs:
        suite_before = skipped_regression_report()
    elif chosen.target is None and selection.suite is not None:
        suite_before = selection.suite  # the suite run free text needed: the same phase
    else:
        bus.emit(PhaseStarted(phase="tests before", detail=f"the regression baseline: {chosen.describe()}"))
        suite_before = await run_tests_in(
            sandbox,
            chosen.target,
            timeout=request.suite_timeout_s,
            workers=WORKERS,
            test_timeout=per_test_limit(request),
        )
    bus.emit(TestsRun(phase="suite_before", target=chosen.target or "", report=suite_before.to_dict()))
    return dataclasses.replace(seen, suite_before=suite_before, task=task_text(selection))


async def _environment_problem(
    request: FixRequest, sandbox: Sandbox, report: TestReport, target: str
) -> EnvironmentNotReady | None:
    """:class:`EnvironmentNotReady` when the target's failure is the environment's (a module not
    installed, a fixture's plugin missing), not a bug for the agent."""
    problem = diagnose(
        report,
        await workspace_module_names(sandbox),
        environment=request.session.spec.environment is not None and request.session.sandbox_kind == "docker",
        recipe=request.session.spec.environment if request.session.sandbox_kind == "docker" else None,
    )
    return None if problem is None else EnvironmentNotReady(problem.message(target))


async def _failing_in_suite(request: FixRequest, sandbox: Sandbox, bus: EventBus) -> Before:
    """No TARGET (or one such as "the failing test": :func:`means_failing_now`): the suite runs
    first and the tests failing in it are the target; when none fails, the request alone says what
    to do or, without a request, there is nothing to fix."""
    said = f"{request.target!r} names the tests failing now" if request.target else "no TARGET"
    bus.emit(
        PhaseStarted(phase="tests before", detail=f"{said}: running the suite to find the tests that fail")
    )
    suite = await run_tests_in(
        sandbox, None, timeout=request.suite_timeout_s, workers=WORKERS, test_timeout=per_test_limit(request)
    )
    bus.emit(TestsRun(phase="suite_before", target="", report=suite.to_dict()))
    failing = [t for t, outcome in suite.outcomes.items() if outcome in ("failed", "error")]
    if failing:
        target = target_for(failing)
        try:
            selection = TestSelection(
                target,
                "failing in the suite",
                await run_tests_in(sandbox, target, test_timeout=per_test_limit(request)),
            )
        except SandboxError as exc:  # the sandbox broke after the suite's run: that run is kept
            return Before(suite_before=suite, stop=exc)
        chosen = f"the {len(failing)} test(s) failing in the suite ({said})"
        bus.emit(
            TestsRun(
                phase="target_before",
                target=selection.target,
                report=selection.report.to_dict(),
                chosen=chosen,
            )
        )
        return Before(
            Mode.FAILING_TESTS,
            f"{selection.target} ({selection.how})",
            selection.target,
            selection.report,
            suite,
            task_text(selection),
            stop=await _environment_problem(request, sandbox, selection.report, selection.target),
        )
    stop: CloverError | None = None
    if not suite.outcomes:
        why = suite.problem or suite.summary()
        stop = UsageError(
            f"found no tests in {request.session.repo} ({why}); a change is checked with the tests"
        )
    elif not suite.all_passed:
        stop = CloverError(f"the suite could not be run as it is: {suite.problem or suite.summary()}")
    elif not request.request:
        meant = f"{request.target!r} means the tests failing now, and " if request.target else ""
        stop = NothingToFix(
            f"nothing to fix: {meant}no test fails ({suite.passed} passed, {suite.skipped} skipped)"
        )
    if stop is not None:
        return Before(suite_before=suite, stop=stop)
    return Before(
        Mode.REQUEST,
        "none: no test fails, the change is the request's",
        suite_before=suite,
        task=evidence.request_task_text(suite),
    )
