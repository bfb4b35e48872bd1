"""Continuing a stopped ``fix`` run: checking that it can go on, and from where (its folder is
found with :func:`clover_agent.fix.runs.locate_run`).

A run's trajectory is its resume state (:func:`~clover_agent.agent.trajectory.load_trajectory`:
the conversation, the budget spent, the workspace patch). ``fix`` also needs what it measured
before the agent started — the tests TARGET resolved to and the suite's baseline — so a resumed
run is verified against the repository as it was, not against the half-repaired workspace.

Every reason a run cannot be resumed is a :class:`UsageError` (exit 2) that says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from clover_agent.agent.records import RecordKey
from clover_agent.agent.trajectory import (
    TRAJECTORY_FILE,
    ResumeState,
    TrajectoryError,
    load_trajectory,
    read_events,
)
from clover_agent.errors import UsageError
from clover_agent.events import (
    Done,
    Event,
    ModelCallStarted,
    ModelResponded,
    RunStarted,
    TaskFinished,
    TaskResumed,
    TaskStarted,
    TestsRun,
)
from clover_agent.fix.runs import check_signed
from clover_agent.tools.run_tests import TestFailure, TestReport

EventT = TypeVar("EventT", bound=Event)


@dataclass
class StoppedRun:
    """A ``fix`` run that stopped before it was done, and what continuing it needs."""

    run_dir: Path
    run_id: str
    target: str  # TARGET as the user gave it
    target_tests: str  # what TARGET resolved to (a ``run_tests`` target)
    selection: str  # "<tests> (<how they were found>)", as the summary shows it
    target_before: TestReport
    suite_before: TestReport
    state: ResumeState
    segments: int  # how many times the run has been started so far
    exit_code: int | None  # of the last segment; None when it ended without a verdict (killed)
    outcome: str  # the agent's outcome in the last segment
    message: str
    launch: dict[str, Any] = dataclasses.field(default_factory=dict)  # how the run was started
    replay_turns_used: int = 0  # of the recorded replay file (a replay taken again continues after them)


def load_stopped_run(run_dir: Path, key: RecordKey, target: str | None = None) -> StoppedRun:
    """Read a run's trajectory and check that it can be resumed (see the module docstring): first
    that ``key`` signed it (:func:`~clover_agent.fix.runs.check_signed`); ``target``, when given,
    must be the run's TARGET."""
    run_id = run_dir.name
    trajectory = run_dir / TRAJECTORY_FILE
    if not trajectory.is_file():
        raise UsageError(f"cannot resume run {run_id}: {trajectory} does not exist")
    check_signed(run_dir, key)
    try:
        events = read_events(trajectory)
        state = load_trajectory(trajectory) if any(isinstance(e, RunStarted) for e in events) else None
    except TrajectoryError as exc:
        raise UsageError(f"cannot resume run {run_id}: the trajectory is damaged: {exc}") from None
    started = next((e for e in events if isinstance(e, TaskStarted)), None)
    if started is None or started.command != "fix":
        raise UsageError(f"cannot resume run {run_id}: {trajectory} does not record a `fix` run")
    segment = _last_segment(events)
    finished = _last(segment, TaskFinished)
    done = _last(segment, Done)
    if finished is not None and finished.exit_code == 0:
        raise UsageError(
            f"run {run_id} already finished successfully ({finished.message}); its patch is "
            f"{run_dir / 'patch.diff'}"
        )
    baseline = {e.phase: e for e in events if isinstance(e, TestsRun) and e.phase.endswith("_before")}
    if state is None or not {"target_before", "suite_before"} <= baseline.keys():
        verdict = f" ({finished.message}, exit {finished.exit_code})" if finished else ""
        raise UsageError(
            f"run {run_id} stopped before the agent started{verdict}: there is nothing to resume; "
            f"start a new run with `clover-agent fix {started.target!r}`"
        )
    if done is not None and done.outcome == "submitted":
        verdict = f"exit {finished.exit_code}: {finished.message}" if finished else done.message
        raise UsageError(
            f"the agent already finished run {run_id} ({verdict}); there is nothing to continue: "
            f"start a new run with `clover-agent fix {started.target!r}`"
        )
    try:
        target_before = _test_report(baseline["target_before"].report)
        suite_before = _test_report(baseline["suite_before"].report)
    except TypeError as exc:
        raise UsageError(f"cannot resume run {run_id}: a recorded test run is damaged ({exc})") from None
    target_tests = baseline["target_before"].target
    selection = str(
        next(
            (
                e.report.get("target")
                for e in reversed(events)
                if isinstance(e, TaskFinished) and e.report.get("target")
            ),
            target_tests,
        )
    )
    # How the latest segment was started (a resumption that recorded nothing: the first one).
    launch = next((e for e in reversed(events) if isinstance(e, TaskResumed) and e.launch), started)
    if target is not None and target != started.target:
        raise UsageError(
            f"TARGET {target!r} differs from the target of run {run_id} ({started.target!r}); "
            "leave TARGET out when resuming"
        )
    last = finished or done
    return StoppedRun(
        run_dir=run_dir,
        run_id=run_id,
        target=started.target,
        target_tests=target_tests,
        selection=selection,
        target_before=target_before,
        suite_before=suite_before,
        state=state,
        segments=1 + sum(isinstance(e, TaskResumed) for e in events),
        exit_code=finished.exit_code if finished else (done.exit_code if done else None),
        outcome=done.outcome if done else "killed",
        message=last.message if last else "the run ended without a verdict",
        launch=dict(launch.launch),
        replay_turns_used=_replay_turns_used(launch, events),
    )


def _replay_turns_used(launch: TaskStarted | TaskResumed, events: list[Event]) -> int:
    """The turns of the recorded replay file used when the run stopped: where the segment that
    recorded it started in the file, and the model calls since. (A record from before
    ``replay_start`` was kept: every model call of the run.)"""
    start = next(i for i, e in enumerate(events) if e is launch) if "replay_start" in launch.launch else 0
    since = events[start:]
    calls = max(
        sum(isinstance(e, ModelCallStarted) for e in since),
        sum(isinstance(e, ModelResponded) for e in since),
    )
    return int(launch.launch.get("replay_start", 0)) + calls


def _last_segment(events: list[Event]) -> list[Event]:
    """The events since the run was last started or resumed."""
    start = max((i for i, e in enumerate(events) if isinstance(e, TaskStarted | TaskResumed)), default=0)
    return events[start:]


def _last(events: list[Event], kind: type[EventT]) -> EventT | None:
    return next((e for e in reversed(events) if isinstance(e, kind)), None)


def _test_report(data: dict[str, Any]) -> TestReport:
    """A :class:`TestReport` back from its ``to_dict()`` form (a ``TestsRun`` event)."""
    names = {f.name for f in dataclasses.fields(TestReport)}
    values = {k: v for k, v in data.items() if k in names}
    values["failures"] = [TestFailure(**f) for f in values.get("failures", [])]
    return TestReport(**values)
