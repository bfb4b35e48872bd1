"""The steps of a ``fix`` run, in order, each value kept as it comes.

:func:`run_steps` is the body of :func:`clover_agent.fix.workflow.run_fix`, which frames it (the
run folder, the trajectory, the report on every way out). The steps: the host's record of the
start (:class:`~clover_agent.handback.stock.Stock`), the failure reproduced and the baseline
(:mod:`clover_agent.fix.reproduce`), the agent (:mod:`clover_agent.session`), the patch made on
the host, and its verification and verdict (:func:`clover_agent.handback.judging.check_patch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.loop import RunResult
from clover_agent.errors import ExitCode
from clover_agent.events import ErrorReported, EventBus, PhaseStarted, SandboxProgress
from clover_agent.fix.report import Before
from clover_agent.fix.reproduce import Reproduce, resumed
from clover_agent.fix.request import FixRequest
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.runs import PATCH_FILE
from clover_agent.handback.judging import Checked, Judging, check_patch
from clover_agent.handback.patches import hidden_work
from clover_agent.handback.stock import Kept, Stock
from clover_agent.handback.verdict import Judgement, Verdict
from clover_agent.session.assembly import AgentSession


@dataclass
class Found:
    """What the steps returned so far, each set once by :func:`run_steps`; the report is built
    from it on every way out of the run."""

    stock: Stock | None = None
    before: Before | None = None
    judging: Judging | None = None
    backend: str = ""
    agent: RunResult | None = None
    kept: Kept | None = None
    checked: Checked | None = None
    deadline: float | None = None  # the whole run's (``FixRequest.whole_run_time``), monotonic


@contextlib.asynccontextmanager
async def by_deadline(deadline: float | None, doing: str) -> AsyncIterator[None]:
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


async def run_steps(
    request: FixRequest, bus: EventBus, run_id: str, run_dir: Path, found: Found, resume: StoppedRun | None
) -> tuple[ExitCode, str]:
    """The steps, in order, each value kept in ``found``; returns the run's exit code and message."""

    def progress(message: str) -> None:
        bus.emit(SandboxProgress(message=message))

    # the environment's set-up and a large copy say what they do (here and in the verifying sandbox)
    session = dataclasses.replace(
        request.session, spec=dataclasses.replace(request.session.spec, progress=progress)
    )
    found.stock = stock = Stock(run_dir, session.repo)
    hidden = hidden_work(session.repo)
    if hidden:  # git hides their changes from `status`; the apply's guard still sees them
        shown = ", ".join(f"{path} ({flag})" for path, flag in list(hidden.items())[:10])
        more = f" and {len(hidden) - 10} more" if len(hidden) > 10 else ""
        bus.emit(
            ErrorReported(
                kind="your tree",
                message=f"{shown}{more}: marked so git hides their changes; they count as your own work, "
                "and a patch that changes them is merged with it",
            )
        )
    docker = session.sandbox_kind == "docker"
    reproduce = Reproduce(
        request.target,
        session.repo,
        request.request,
        request.regression,
        request.suite_timeout_s,
        request.per_test,
        environment=session.spec.environment if docker else None,
    )
    bus.emit(PhaseStarted(phase="set-up", detail=f"starting the {session.sandbox_kind} sandbox"))
    parts = AgentSession(
        session,
        bus,
        run_id=run_id,
        folder=run_dir,
        report=lambda message: bus.emit(ErrorReported(kind="mcp", message=message)),
    )
    try:
        sandbox = await parts.open_sandbox()
        async with by_deadline(found.deadline, "reproducing the failure"):
            await stock.record_start(sandbox)  # before any test or the agent ran
            found.before = before = await reproduce.run(sandbox, bus) if resume is None else resumed(resume)
        if before.stop is not None:
            raise before.stop
        assert before.suite_before is not None
        found.judging = Judging(
            session.spec,
            session.sandbox_kind,
            stock,
            before.suite_before,
            before.target_tests,
            before.target_before,
            suite_timeout_s=request.suite_timeout_s,
            test_timeout_s=request.per_test,
        )
        backend = session.make_backend()
        found.backend = backend.name
        try:
            budget = Budget(
                session.max_steps, session.max_time_s, session.max_tokens, deadline=found.deadline
            )
            agent = await parts.open_agent(backend, budget, request.approvals, planning=bool(request.plan))
            try:
                if resume is None:
                    task = f"{request.request}\n\n{before.task}" if request.request else before.task
                    if request.plan:
                        agent.start_planning()
                    found.agent = result = await agent.run(task, await parts.system_prompt())
                    if result.plan is not None and request.plan == "go":
                        found.agent = result = await agent.continue_with(agent.approve_plan(result.plan))
                else:  # the system prompt and the task are in the recorded conversation
                    found.agent = result = await agent.run(
                        resume.state.task, "", resume=resume.state, fresh_budget=True
                    )
            except (asyncio.CancelledError, KeyboardInterrupt):
                found.agent = agent.result  # interrupted: its steps and tokens are still the run's
                raise
        finally:
            try:
                await parts.close_agent()
            finally:
                await backend.close()
        found.kept = kept = await stock.take(sandbox, run_dir / PATCH_FILE)
    finally:
        await parts.close()
    if not result.submitted:
        return result.exit_code, result.message
    if kept.patch_set is None:  # the workspace could not be read back: nothing can be handed back
        found.checked = Checked(Judgement(Verdict.NOT_FIXED, ExitCode.SANDBOX_UNAVAILABLE, kept.problem))
    else:
        async with by_deadline(found.deadline, "verifying the patch"):
            found.checked = await check_patch(found.judging, kept.patch_set, bus)
    return found.checked.judged.exit_code, found.checked.judged.message
