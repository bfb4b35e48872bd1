"""The verdict of a ``fix`` run: never more than was checked.

:func:`judge` reads the test runs before and after the patch (the after runs are made on the
exact patched tree, see :mod:`clover_agent.fix.stock`) and picks one of (README, "Verdicts"):

- ``fixed`` (exit 0): every target test passes (a skipped, deselected or vanished one is not a
  pass), no test that passed before fails, errors, is skipped or is gone, the tests were not
  weakened, and the suite's run is a real check;
- ``fixed, suite unverified`` (exit 8): the same for the target, but the rest of the suite could
  not be checked (it timed out or could not be run or collected before or after, tests erred for
  environment reasons both times, or none passed before): "nothing else broke" is not known;
- ``tests weakened`` (exit 1): the target passes because its tests were weakened
  (:mod:`clover_agent.fix.weakened`);
- ``not fixed`` (exit 1): a target test does not pass, or tests that passed before do not, or
  nothing changed.

Tests that failed before and still fail are listed either way (``still_failing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clover_agent.errors import ExitCode
from clover_agent.fix.regression import renamed_cases
from clover_agent.tools.run_tests import TestReport

FIXED = "fixed"
FIXED_UNVERIFIED = "fixed, suite unverified"
TESTS_WEAKENED = "tests weakened"
NOT_FIXED = "not fixed"
#: What JUnit XML calls a module pytest could not import.
COLLECTION_FAILURE = "collection failure"


@dataclass
class Judgement:
    verdict: str
    exit_code: ExitCode
    message: str
    regressions: list[str] = field(default_factory=list)
    still_failing: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)  # why the suite's run checks less than all
    weakened: list[str] = field(default_factory=list)
    target_not_passing: dict[str, str] = field(default_factory=dict)  # test id -> what it is now


def _failing(report: TestReport) -> set[str]:
    return {t for t, outcome in report.outcomes.items() if outcome in ("failed", "error")}


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:300]


def uncollected(report: TestReport) -> set[str]:
    """The ids of the modules ``report``'s run could not collect (import)."""
    return {f.test_id for f in report.failures if f.message == COLLECTION_FAILURE}


def target_problems(before: TestReport, after: TestReport) -> dict[str, str]:
    """Each target test that is not a pass after the change, with what it is: "failed",
    "error", "skipped" or "gone" (not run at all: deselected, renamed or deleted). A module that
    could not be collected before either is not a target test (it holds none that ran): the suite's
    verdict counts it (:func:`suite_gaps`)."""
    old = uncollected(before)
    problems = {t: after.outcomes.get(t, "gone") for t in before.outcomes if t not in old}
    problems = {t: what for t, what in problems.items() if what != "passed"}
    problems.update(
        {
            t: o
            for t, o in after.outcomes.items()
            if o in ("failed", "error") and t not in problems and t not in old
        }
    )
    return problems


def target_passes(before: TestReport, after: TestReport) -> bool:
    """The target's run after the change is a pass: it ran, some target test passed, and
    :func:`target_problems` finds nothing."""
    ran = after.problem is None and not after.timed_out and after.passed > 0
    return ran and not target_problems(before, after)


def regressions(before: TestReport, after: TestReport) -> list[str]:
    """Tests that passed before and now fail, error, are skipped or are gone (cases whose
    parametrize ids merely differ between the runs, :func:`renamed_cases`, are not gone)."""
    renamed = renamed_cases(before, after)
    return sorted(
        t
        for t, o in before.outcomes.items()
        if o == "passed" and after.outcomes.get(t) != "passed" and t not in renamed
    )


def suite_gaps(before: TestReport, after: TestReport, environment_errors: set[str]) -> list[str]:
    """Why the suite's runs check less than the whole suite (empty: a real check).
    ``environment_errors``: tests that erred for environment reasons in both runs."""
    gaps = []
    for when, report in (("before", before), ("after", after)):
        if report.timed_out:
            gaps.append(f"the suite timed out {when} the change (after {report.duration_s:.0f} s)")
        elif report.problem and not report.outcomes:
            gaps.append(f"the suite could not be run {when} the change: {_first_line(report.problem)}")
    if not gaps:
        modules = sorted(uncollected(before) | uncollected(after))
        if modules:
            shown = ", ".join(t.split("::")[0] for t in modules[:5])
            gaps.append(f"{len(modules)} test module(s) could not be collected: {shown}")
        if environment_errors:
            shown = ", ".join(sorted(environment_errors)[:5])
            gaps.append(
                f"{len(environment_errors)} test(s) could not run in the sandbox's environment, before or "
                f"after: {shown}"
            )
        if before.passed == 0 and before.outcomes:
            gaps.append("no test of the suite passed before the change, so none could break")
    return gaps


def judge(
    target_before: TestReport,
    target_after: TestReport,
    suite_before: TestReport,
    suite_after: TestReport | None,
    *,
    files_changed: list[str],
    weakened: list[str],
    environment_errors: set[str],
) -> Judgement:
    """The verdict (see the module docstring)."""
    still = sorted(_failing(suite_before) & _failing(suite_after)) if suite_after is not None else []
    if target_after.timed_out or (target_after.problem and not target_after.outcomes):
        why = "timed out" if target_after.timed_out else _first_line(target_after.problem or "")
        return Judgement(
            NOT_FIXED, ExitCode.FAILURE, f"the target tests could not be run after the change: {why}"
        )
    problems = target_problems(target_before, target_after)
    if problems or not target_passes(target_before, target_after):
        shown = ", ".join(f"{t} ({what})" for t, what in list(problems.items())[:10])
        return Judgement(
            NOT_FIXED,
            ExitCode.FAILURE,
            "the agent finished, but the target does not pass: "
            + (shown or f"the run ended with exit code {target_after.exit_code}"),
            still_failing=still,
            target_not_passing=problems,
        )
    if weakened:
        return Judgement(
            TESTS_WEAKENED,
            ExitCode.FAILURE,
            "the target passes, but its tests were weakened: " + "; ".join(weakened[:5]),
            still_failing=still,
            weakened=weakened,
        )
    assert suite_after is not None
    gaps = suite_gaps(suite_before, suite_after, environment_errors)
    broke = (
        []
        if any("timed out" in g or "could not be run" in g for g in gaps)
        else regressions(suite_before, suite_after)
    )
    if broke:
        after = suite_after.outcomes
        shown = ", ".join(f"{t} ({after.get(t, 'gone')})" for t in broke[:10])
        return Judgement(
            NOT_FIXED,
            ExitCode.FAILURE,
            f"the target passes now, but tests that passed before do not: {shown}",
            regressions=broke,
            still_failing=still,
        )
    if not files_changed:
        return Judgement(
            NOT_FIXED,
            ExitCode.FAILURE,
            "the agent changed no file, yet the target passes now (a flaky test?)",
        )
    if gaps:
        return Judgement(
            FIXED_UNVERIFIED,
            ExitCode.SUITE_UNVERIFIED,
            "the target passes, but the rest of the suite is unverified: " + "; ".join(gaps),
            still_failing=still,
            unverified=gaps,
        )
    return Judgement(
        FIXED,
        ExitCode.OK,
        "fixed: the target passes and no test that passed before fails"
        + (f" ({len(still)} failed before and still fail)" if still else ""),
        still_failing=still,
    )
