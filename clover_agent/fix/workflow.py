"""The ``fix`` workflow: reproduce a failing test, let the agent repair it, verify, keep the patch.

:func:`run_fix` is what every front end of the workflow calls (``clover-agent fix``, the CI bot,
``eval``) with a :class:`~clover_agent.fix.request.FixRequest`. It frames the run: its folder,
its trajectory (opened, then closed on the verdict), and the frozen report built once, however the
run ends, from the values the steps returned (:mod:`clover_agent.fix.steps`; the order is in
docs/architecture.md, "The fix workflow's steps"). A stopped run continues with ``resume=``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.errors import RUN_ERRORS, ExitCode, exit_code_for, message_of
from clover_agent.events import (
    Done,
    ErrorReported,
    EventBus,
    PhaseStarted,
    TaskFinished,
    TaskResumed,
    TaskStarted,
)
from clover_agent.fix.report import FixReport, build_report, write_summary
from clover_agent.fix.reproduce import EnvironmentNotReady, NothingToFix
from clover_agent.fix.request import FixRequest
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.runs import new_run_id, runs_dir
from clover_agent.fix.steps import Found, run_steps
from clover_agent.handback.judging import Checked, check_patch
from clover_agent.handback.stock import SHADOW_DIR, PatchSet
from clover_agent.sandboxes.errors import SandboxSetupError

__all__ = ["EnvironmentNotReady", "FixRequest", "NothingToFix", "run_fix", "verify_part"]


async def run_fix(request: FixRequest, bus: EventBus, *, resume: StoppedRun | None = None) -> FixReport:
    """The whole run; ``resume`` continues that stopped run.

    Never raises any layer's error (:data:`~clover_agent.errors.RUN_ERRORS`) once the run folder
    exists: failures end up in the report, the summary file and the trajectory, whose last event is
    a ``TaskFinished`` holding the same verdict and exit code as the summary file.
    """
    started = time.monotonic()
    session = request.session
    run_id = resume.run_id if resume else new_run_id()
    if resume is not None:
        run_dir = resume.run_dir
        shutil.rmtree(run_dir / SHADOW_DIR, ignore_errors=True)  # a killed segment's: the run makes its own
    else:
        run_dir = request.run_dir or runs_dir(session.repo) / run_id
    writer = TrajectoryWriter(
        run_dir / TRAJECTORY_FILE, keep_stream=request.keep_stream, key=session.record_key
    )
    unsubscribe = bus.subscribe(writer)
    repo, kind = str(session.repo), session.sandbox_kind
    if resume is None:
        bus.emit(
            TaskStarted(
                run_id=run_id,
                command=request.command,
                target=request.target,
                repo=repo,
                sandbox=kind,
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
                repo=repo,
                sandbox=kind,
                launch=request.launch,
            )
        )
    found = Found()
    exit_code, message = ExitCode.FAILURE, ""
    if request.whole_run_time and session.max_time_s is not None:
        found.deadline = started + session.max_time_s
    try:
        exit_code, message = await run_steps(request, bus, run_id, run_dir, found, resume)
    except RUN_ERRORS as exc:
        exit_code, message = exit_code_for(exc), message_of(exc)
        if isinstance(exc, SandboxSetupError) and exc.log:
            message += f"\n(the set-up's whole output: {keep_setup_log(run_dir, exc.log)})"
        outcome = "nothing_to_fix" if isinstance(exc, NothingToFix) else "error"
        bus.emit(ErrorReported(kind=outcome, message=message, fatal=True, exit_code=int(exit_code)))
        if found.agent is None:  # the loop emits its own Done
            bus.emit(Done(outcome=outcome, exit_code=int(exit_code), message=message))
    except (asyncio.CancelledError, KeyboardInterrupt):
        exit_code, message = ExitCode.INTERRUPTED, "interrupted"
        raise
    finally:
        exit_code = ExitCode(request.exit_codes.get(int(exit_code), int(exit_code)))
        blocked = found.agent is not None and found.agent.blocked and exit_code == ExitCode.FAILURE
        if blocked and request.blocked_exit_code is not None:
            exit_code = ExitCode(request.blocked_exit_code)
        report = build_report(
            run_id,
            run_dir,
            exit_code=exit_code,
            message=message,
            elapsed_s=time.monotonic() - started,
            key=session.record_key,
            stock=found.stock,
            before=found.before,
            judging=found.judging,
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


async def verify_part(report: FixReport, part: PatchSet, bus: EventBus) -> Checked:
    """Step 4 again, at the hand-back, for ``part`` of the verified patch (what is to be applied when
    files are left out: :meth:`~clover_agent.handback.stock.Stock.subset`): the same runs and checks
    on exactly those bytes, in a fresh sandbox; its verdict is then the run's."""
    assert report.judging is not None, "only a judged patch has parts to verify"
    bus.emit(
        PhaseStarted(
            phase="verification", detail=f"verifying {len(part.files)} file(s) to apply on their own"
        )
    )
    return await check_patch(report.judging, part, bus)


#: The file in a run's folder holding a failed environment set-up's whole output.
SETUP_LOG = "environment-setup.log"


def keep_setup_log(run_dir: Path, log: str) -> Path:
    """Write a failed set-up's whole output (pip's, a build's) into the run folder; its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SETUP_LOG
    path.write_text(log, encoding="utf-8", errors="replace")
    return path
