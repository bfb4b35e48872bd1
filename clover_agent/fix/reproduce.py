"""Steps 1 and 2 of ``fix``: the failure confirmed before any agent, and the regression baseline.

:class:`Reproduce` holds what these steps need of the request (the workflow builds it once) and
returns a :class:`~clover_agent.fix.report.Before`: how the tests to fix were chosen, their runs,
the agent's task, or why the run stops here (nothing to fix, the environment to blame, tests that
cannot run).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from clover_agent.environments.recipe import EnvironmentRecipe
from clover_agent.errors import CloverError, ExitCode, UsageError
from clover_agent.events import EventBus, PhaseStarted, TestsRun
from clover_agent.fix.regression import select_regression
from clover_agent.fix.report import Before, Mode
from clover_agent.fix.resume import StoppedRun
from clover_agent.fix.targets import TestSelection, means_failing_now, select_tests
from clover_agent.handback import evidence
from clover_agent.handback.diagnosis import diagnose, workspace_module_names
from clover_agent.handback.judging import WORKERS, target_for
from clover_agent.handback.verdict import skipped_regression_report
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.errors import SandboxError
from clover_agent.tools.run_tests import TestReport, run_tests_in


class NothingToFix(CloverError):
    exit_code = ExitCode.NOTHING_TO_FIX


class EnvironmentNotReady(CloverError):
    """The target cannot run in the sandbox's environment (named by :mod:`clover_agent.handback.diagnosis`)."""

    exit_code = ExitCode.SANDBOX_UNAVAILABLE


def task_text(selection: TestSelection) -> str:
    """The agent's task: the failing tests, how they were chosen, and their run now."""
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


@dataclass(frozen=True)
class Reproduce:
    """What steps 1 and 2 take from a ``fix`` request.

    - ``target``: TARGET as given; "" (or words meaning "the failing tests"): the suite's failures.
    - ``request``: the user's request; with no failing test, it alone says what to do.
    - ``environment``: the Docker sandbox's project environment (None: none, or not Docker), for
      telling an environment problem from a bug.
    """

    target: str
    repo: Path
    request: str
    regression: str
    suite_timeout_s: float
    test_timeout_s: float
    environment: EnvironmentRecipe | None = None

    async def run(self, sandbox: Sandbox, bus: EventBus) -> Before:
        """The target's failure confirmed (an environment problem stops the run: ``stop``), then the
        regression baseline (one run; free text's suite run is reused)."""
        if not self.target or means_failing_now(self.target, self.repo):
            return await self._failing_in_suite(sandbox, bus)
        bus.emit(
            PhaseStarted(
                phase="tests before", detail=f"finding and running the tests {self.target!r} selects"
            )
        )
        selection = await select_tests(
            sandbox,
            self.target,
            self.repo,
            workers=WORKERS,
            suite_timeout=self.suite_timeout_s,
            test_timeout=self.test_timeout_s,
        )
        seen = Before(
            Mode.TARGET, f"{selection.target} ({selection.how})", selection.target, selection.report
        )
        chosen = f"the tests whose names share the most words with {self.target!r}"
        bus.emit(
            TestsRun(
                phase="target_before",
                target=selection.target,
                report=selection.report.to_dict(),
                chosen=chosen if selection.how == "free text" else "",
            )
        )
        try:
            return await self._baseline(sandbox, bus, selection, seen)
        except SandboxError as exc:  # the sandbox broke after the target's run: that run is kept
            return dataclasses.replace(seen, stop=exc)

    async def _baseline(
        self, sandbox: Sandbox, bus: EventBus, selection: TestSelection, seen: Before
    ) -> Before:
        """After the target's run (``seen``): stop when nothing fails or the environment is to blame,
        else the regression baseline."""
        report = selection.report
        if report.all_passed:
            total = report.total
            return dataclasses.replace(
                seen,
                stop=NothingToFix(
                    f"nothing to fix: {self.target!r} selects {total} test{'' if total == 1 else 's'} and none "
                    f"fails ({report.passed} passed, {report.skipped} skipped)"
                ),
            )
        problem = await self._environment_problem(sandbox, report, self.target)
        if problem is not None:
            return dataclasses.replace(seen, stop=problem)
        if report.problem and not report.outcomes:
            return dataclasses.replace(
                seen, stop=CloverError(f"the target tests could not be run: {report.problem}")
            )
        chosen = await select_regression(sandbox, self.regression, list(report.outcomes))
        if not chosen.runs:
            suite_before = skipped_regression_report()
        elif chosen.target is None and selection.suite is not None:
            suite_before = selection.suite  # the suite run free text needed: the same phase
        else:
            bus.emit(
                PhaseStarted(phase="tests before", detail=f"the regression baseline: {chosen.describe()}")
            )
            suite_before = await run_tests_in(
                sandbox,
                chosen.target,
                timeout=self.suite_timeout_s,
                workers=WORKERS,
                test_timeout=self.test_timeout_s,
            )
        bus.emit(TestsRun(phase="suite_before", target=chosen.target or "", report=suite_before.to_dict()))
        return dataclasses.replace(seen, suite_before=suite_before, task=task_text(selection))

    async def _environment_problem(
        self, sandbox: Sandbox, report: TestReport, target: str
    ) -> EnvironmentNotReady | None:
        """:class:`EnvironmentNotReady` when the target's failure is the environment's (a module not
        installed, a fixture's plugin missing), not a bug for the agent."""
        problem = diagnose(
            report,
            await workspace_module_names(sandbox),
            environment=self.environment is not None,
            recipe=self.environment,
        )
        return None if problem is None else EnvironmentNotReady(problem.message(target))

    async def _failing_in_suite(self, sandbox: Sandbox, bus: EventBus) -> Before:
        """No TARGET (or one such as "the failing test"): the suite runs first and the tests failing
        in it are the target; when none fails, the request alone says what to do or, without a
        request, there is nothing to fix."""
        said = f"{self.target!r} names the tests failing now" if self.target else "no TARGET"
        bus.emit(
            PhaseStarted(
                phase="tests before", detail=f"{said}: running the suite to find the tests that fail"
            )
        )
        suite = await run_tests_in(
            sandbox, None, timeout=self.suite_timeout_s, workers=WORKERS, test_timeout=self.test_timeout_s
        )
        bus.emit(TestsRun(phase="suite_before", target="", report=suite.to_dict()))
        failing = [t for t, outcome in suite.outcomes.items() if outcome in ("failed", "error")]
        if failing:
            return await self._failing(sandbox, bus, suite, failing, said)
        stop: CloverError | None = None
        if not suite.outcomes:
            why = suite.problem or suite.summary()
            stop = UsageError(f"found no tests in {self.repo} ({why}); a change is checked with the tests")
        elif not suite.all_passed:
            stop = CloverError(f"the suite could not be run as it is: {suite.problem or suite.summary()}")
        elif not self.request:
            meant = f"{self.target!r} means the tests failing now, and " if self.target else ""
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

    async def _failing(
        self, sandbox: Sandbox, bus: EventBus, suite: TestReport, failing: list[str], said: str
    ) -> Before:
        """The tests failing in the suite's run, run again on their own as the target."""
        target = target_for(failing)
        try:
            selection = TestSelection(
                target,
                "failing in the suite",
                await run_tests_in(sandbox, target, test_timeout=self.test_timeout_s),
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
            stop=await self._environment_problem(sandbox, selection.report, selection.target),
        )


def resumed(stopped: StoppedRun) -> Before:
    """Steps 1 and 2 of a resumed run, from its trajectory."""
    return Before(
        selection=stopped.selection,
        target_tests=stopped.target_tests,
        target_before=stopped.target_before,
        suite_before=stopped.suite_before,
    )
