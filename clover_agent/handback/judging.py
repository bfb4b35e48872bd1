"""Judging a patch as every front end judges it: held out, in a fresh sandbox, with every check.

:func:`check_patch` is step 4 of ``fix`` and the judgement of the TUI's ``/apply`` and of ACP's
offer alike. It takes what the patch is judged against (:class:`Judging`: the baseline runs, the
target tests or none) and returns a :class:`Checked`: the verdict with its message, the runs and,
for a change made from a request alone, the tests that show it (one must fail without the change).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from clover_agent.errors import ExitCode
from clover_agent.events import EventBus, TestsRun
from clover_agent.handback import evidence
from clover_agent.handback.snapshot import left_out_lines
from clover_agent.handback.stock import HandBackError, PatchSet, Stock
from clover_agent.handback.verdict import (
    NO_REGRESSION_RUN,
    Judgement,
    Verdict,
    regression_skipped,
    skipped_regression_report,
)
from clover_agent.handback.verify import Verification, verify_patch
from clover_agent.sandboxes.base import Sandbox, SandboxSpec
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, default_test_timeout, run_tests_in

#: pytest-xdist processes for a suite run (the sandbox has 2 CPUs by default).
WORKERS = 2


@dataclass(frozen=True)
class Shown:
    """A change made from the request alone: its tests without it, and those that show it."""

    without_change: TestReport
    shown_by: tuple[str, ...]


@dataclass(frozen=True)
class Checked:
    """The verdict (with the notes of how it was reached in its message), the runs on the patched
    tree (None when they could not be made) and, from a request, what shows the change."""

    judged: Judgement
    runs: Verification | None = None
    shown: Shown | None = None


@dataclass(frozen=True)
class Judging:
    """What a patch is judged against.

    - ``spec``, ``kind``: the sandbox every verifying run gets a fresh one of.
    - ``stock``: the host's record the patch was made from (it makes those sandboxes the patch).
    - ``suite_before``: the suite's run before the change (or the stand-in of no regression run).
    - ``target_tests``, ``target_before``: the failing tests to fix and their run before; empty:
      the request alone says what to do, and the test files the patch adds or changes are the target.
    """

    spec: SandboxSpec
    kind: str
    stock: Stock
    suite_before: TestReport
    target_tests: str = ""
    target_before: TestReport | None = None
    suite_timeout_s: float = DEFAULT_TIMEOUT_S
    #: Each test's own limit in every run; None: a fifth of the suite's.
    test_timeout_s: float | None = None

    @property
    def per_test(self) -> float:
        return self.test_timeout_s or default_test_timeout(self.suite_timeout_s)


def target_for(test_ids: list[str]) -> str:
    """A ``run_tests`` target selecting ``test_ids``: the node ids themselves, or (when an id holds a
    space, as a parameter id may) their test names as a ``-k`` expression."""
    if any(len(test_id.split()) > 1 for test_id in test_ids):
        return "-k " + " or ".join(sorted({re.sub(r"\[.*\]$", "", t.split("::")[-1]) for t in test_ids}))
    return " ".join(test_ids)


def _no_test(message: str) -> Checked:
    return Checked(Judgement(Verdict.NOT_FIXED, ExitCode.FAILURE, message))


async def check_patch(judging: Judging, patch_set: PatchSet, bus: EventBus) -> Checked:
    """The target and the suite on the exact patched tree, in a fresh sandbox, and the verdict.
    No target tests (working from the request alone): the test files the patch adds or changes are
    the target, and one of them must fail without the change (:func:`_show_change`)."""
    suite_before, target_tests, target_before = (
        judging.suite_before,
        judging.target_tests,
        judging.target_before,
    )
    from_request = not target_tests
    if from_request:
        target_tests = " ".join(evidence.test_files(patch_set))
        if not target_tests:
            return _no_test(
                "no test shows the change: the patch adds or changes no test file (with no failing test, "
                "a test that fails without the change and passes with it is needed)"
            )
        # Nothing failed before: the new tests' baseline is their run without the change, below.
        target_before = TestReport(
            framework=suite_before.framework, command="", target=target_tests, exit_code=0
        )
    assert target_before is not None

    async def suite(sandbox: Sandbox) -> TestReport:
        if regression_skipped(suite_before):  # --regression none: nothing to run again
            return skipped_regression_report()
        # the same tests as the baseline: the whole suite, or the related files it ran
        return await run_tests_in(
            sandbox,
            suite_before.target,
            timeout=judging.suite_timeout_s,
            workers=WORKERS,
            guarded=True,
            framework=suite_before.framework,
            test_timeout=judging.per_test,
        )

    try:
        runs = await verify_patch(
            judging.spec,
            judging.kind,
            judging.stock,
            patch_set,
            target_tests=target_tests,
            target_before=target_before,
            suite_before=suite_before,
            bus=bus,
            run_suite=suite,
            keep_tests=frozenset(target_tests.split()) if from_request else frozenset(),
            test_timeout=judging.per_test,
        )
    except HandBackError as exc:
        return _no_test(exc.message)
    judged = _scoped(runs.judgement, suite_before)
    shown = None
    if from_request and judged.verdict.fixed:
        try:
            shown = await _show_change(judging, bus, patch_set, runs.target_after, target_tests)
        except HandBackError as exc:
            failed = dataclasses.replace(
                judged, verdict=Verdict.NOT_FIXED, exit_code=ExitCode.FAILURE, message=exc.message
            )
            return Checked(failed, runs)
        judged = _judged_by_change(judged, shown, target_tests)
    return Checked(_noted(judged, patch_set), runs, shown)


def _scoped(judged: Judgement, suite_before: TestReport) -> Judgement:
    """The verdict's message says what the suite's runs covered (none, or related files only)."""
    if regression_skipped(suite_before) and judged.verdict == Verdict.FIXED_UNVERIFIED:
        return dataclasses.replace(
            judged,
            unverified=[NO_REGRESSION_RUN],
            message=f"the target passes; the rest of the suite was not checked ({NO_REGRESSION_RUN})",
        )
    if suite_before.target and judged.verdict == Verdict.FIXED:
        files = len(set(suite_before.target.split()))
        return dataclasses.replace(
            judged,
            message=f"{judged.message} in the {files} related test file(s) checked (--regression related)",
        )
    return judged


def _noted(judged: Judgement, patch_set: PatchSet) -> Judgement:
    """A fix's message names what was left out of the patch and the target tests skipped throughout."""
    if patch_set.left_out and judged.verdict.fixed:
        lines = left_out_lines(patch_set.left_out)
        listed = "; ".join(lines[:5]) + (f"; and {len(lines) - 5} more" if len(lines) > 5 else "")
        left_out = f" ({len(patch_set.left_out)} change(s) left out of the patch: {listed})"
        judged = dataclasses.replace(judged, message=judged.message + left_out)
    if judged.skipped and judged.verdict.fixed:  # not a failure, and not hidden either
        skipped = judged.skipped
        names = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        judged = dataclasses.replace(
            judged,
            message=f"{judged.message}; {len(skipped)} target test(s) skipped before and after, so not "
            f"checked: {names}",
        )
    return judged


async def _show_change(
    judging: Judging, bus: EventBus, patch_set: PatchSet, target_after: TestReport, target_tests: str
) -> Shown:
    """A change made from the request alone: its tests run without it, and those that show it."""
    without = await evidence.run_without_change(
        judging.kind, judging.spec, patch_set, target_tests, judging.per_test, judging.stock
    )
    bus.emit(TestsRun(phase="without_change", target=target_tests, report=without.to_dict()))
    return Shown(without, tuple(evidence.shown_by(target_after, without)))


def _judged_by_change(judged: Judgement, shown: Shown, target_tests: str) -> Judgement:
    """The verdict for a change made from the request alone: a changed test must fail without it."""
    if not shown.shown_by:
        message = f"no test shows the change: the tests in {target_tests} pass without it too" + (
            " (the run without the change timed out)" if shown.without_change.timed_out else ""
        )
        return dataclasses.replace(
            judged, verdict=Verdict.NOT_FIXED, exit_code=ExitCode.FAILURE, message=message
        )
    names = ", ".join(shown.shown_by[:5]) + (" ..." if len(shown.shown_by) > 5 else "")
    done = f"done: {names} fails without the change and passes with it"
    # A verdict of FIXED_UNVERIFIED keeps its exit code and says why.
    message = (
        f"{done}, and nothing else broke" if judged.verdict == Verdict.FIXED else f"{done}; {judged.message}"
    )
    return dataclasses.replace(judged, message=message)
