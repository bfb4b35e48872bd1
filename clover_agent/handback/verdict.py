"""The verdict of a ``fix`` run: never more than was checked.

:func:`judge` reads the test runs before and after the patch (the after-runs are made on the exact
patched tree, held out first: :mod:`clover_agent.handback.heldout`) and picks one
:class:`Verdict` — ``fixed``, ``fixed, suite unverified``, ``tests changed``, ``tests weakened``
(:mod:`clover_agent.handback.weakened`) or ``not fixed``; ``needs review`` comes after, from the
checks of :mod:`clover_agent.handback.checks` — each defined, with its exit code,
in README's "Verdicts" table. Tests that failed before and still fail are listed either way
(``still_failing``), and so are target tests skipped before and after (``skipped``: no failure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from clover_agent.errors import ExitCode
from clover_agent.tools.run_tests import TestReport


class Verdict(StrEnum):
    """The verdicts of the module docstring, as summary.json and the README's table name them."""

    FIXED = "fixed"
    FIXED_UNVERIFIED = "fixed, suite unverified"
    TESTS_CHANGED = "tests changed"
    TESTS_WEAKENED = "tests weakened"
    NOT_FIXED = "not fixed"
    #: The target passes, but a check of how it passes (the tamper scan, the canaries, the
    #: independent run, the results channel: :mod:`clover_agent.handback.checks`) found
    #: something a person must look at. Never applied without a person's yes.
    NEEDS_REVIEW = "needs review"

    @property
    def fixed(self) -> bool:
        """The patch makes the target pass (the suite's check may be incomplete); never true of
        ``needs review``."""
        return self in (Verdict.FIXED, Verdict.FIXED_UNVERIFIED)


#: What JUnit XML calls a module pytest could not import.
COLLECTION_FAILURE = "collection failure"


@dataclass(frozen=True)
class Judgement:
    """A verdict, the exit code and message it gives the command, and what it lists."""

    verdict: Verdict
    exit_code: ExitCode
    message: str
    regressions: list[str] = field(default_factory=list)
    still_failing: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)  # why the suite's run checks less than all
    weakened: list[str] = field(default_factory=list)
    target_not_passing: dict[str, str] = field(default_factory=dict)  # test id -> what it is now
    tests_changed: list[str] = field(default_factory=list)  # the harness files the patch changes
    skipped: list[str] = field(default_factory=list)  # target tests skipped before and after: not checked
    review: list[str] = field(default_factory=list)  # what the checks of how it passes found


#: What the baseline of a run without regression runs says (kept so a resumed run knows).
NO_REGRESSION_RUN = "no regression run (--regression none): only the target is checked"


def skipped_regression_report() -> TestReport:
    """The stand-in baseline of a run with ``--regression none``."""
    return TestReport(framework="none", command="", target=None, exit_code=None, problem=NO_REGRESSION_RUN)


def regression_skipped(baseline: TestReport) -> bool:
    return baseline.problem == NO_REGRESSION_RUN and not baseline.outcomes


def _case_base(test_id: str) -> str:
    """``tests/t.py::test_f[a-1]`` without its parametrize id: ``tests/t.py::test_f``."""
    return re.sub(r"\[.*\]$", "", test_id)


def renamed_cases(before: TestReport, after: TestReport) -> set[str]:
    """The tests of ``before`` that are gone from ``after`` only because their parametrize ids
    differ between runs (ids made from the clock, random values or object addresses, e.g. a case
    named after ``datetime.now()``): their test function has as many cases in both runs, and those
    only in ``after`` all passed. A deleted, deselected or failing case is not among them."""

    def cases(report: TestReport) -> dict[str, set[str]]:
        grouped: dict[str, set[str]] = {}
        for test_id in report.outcomes:
            if test_id.endswith("]"):
                grouped.setdefault(_case_base(test_id), set()).add(test_id)
        return grouped

    was, now = cases(before), cases(after)
    renamed: set[str] = set()
    for base, old in was.items():
        new = now.get(base, set())
        gone, added = old - new, new - old
        if gone and len(old) == len(new) and all(after.outcomes[t] == "passed" for t in added):
            renamed |= gone
    return renamed


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
    verdict counts it (:func:`suite_gaps`); nor is a test skipped before and after
    (:func:`skipped_throughout`: a parametrized case skipped where it runs), while one skipped only
    after the change is a problem."""
    old = uncollected(before) | set(skipped_throughout(before, after))
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


def skipped_throughout(before: TestReport, after: TestReport) -> list[str]:
    """The target tests skipped before the change and after it: they checked nothing either time."""
    return [t for t, o in before.outcomes.items() if o == "skipped" and after.outcomes.get(t) == "skipped"]


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


@dataclass(frozen=True)
class HandedBack:
    """The runs on the patch as handed back: the target, and the test files the patch adds,
    changes or deletes (``files``; ``tests`` None when there are none or the target failed)."""

    target: TestReport
    files: list[str] = field(default_factory=list)
    tests: TestReport | None = None

    def problem(self, target_before: TestReport) -> str | None:
        """Why the target does not pass as handed back, None when it does."""
        if target_passes(target_before, self.target):
            return None
        problems = target_problems(target_before, self.target)
        return ", ".join(f"{t} ({what})" for t, what in list(problems.items())[:10]) or (
            f"the run ended with exit code {self.target.exit_code}"
        )

    def broken(self, before: list[TestReport]) -> tuple[list[str], list[str]]:
        """(tests of ``files`` that passed ``before`` and do not as handed back, tests the patch
        adds that fail)."""
        if self.tests is None:
            return [], []
        files = set(self.files)
        passed: dict[str, str] = {}
        for report in before:
            passed.update(
                {t: o for t, o in report.outcomes.items() if o == "passed" and t.split("::")[0] in files}
            )
        was = TestReport(
            framework=self.tests.framework, command="", target=None, exit_code=0, outcomes=passed
        )
        known = {t for report in before for t in report.outcomes}
        new_failing = sorted(
            t for t, o in self.tests.outcomes.items() if o in ("failed", "error") and t not in known
        )
        return regressions(was, self.tests), new_failing


def judge(
    target_before: TestReport,
    target_after: TestReport,
    suite_before: TestReport,
    suite_after: TestReport | None,
    *,
    files_changed: list[str],
    weakened: list[str],
    environment_errors: set[str],
    handed_back: HandedBack | None = None,
    tests_changed: list[str] | None = None,
    flaky: set[str] | frozenset[str] = frozenset(),
    doctests_changed: list[str] | None = None,
) -> Judgement:
    """The verdict (see the module docstring). ``target_after`` and ``suite_after`` are the
    held-out runs (the starting commit's tests over the patched source); ``handed_back``: the runs
    on the patch as handed back (None: it is the held-out tree); ``tests_changed``: the paths the
    held-out run put back; ``flaky``: tests that broke in the held-out suite run and passed when run
    again (no regression, but nothing verified about them); ``doctests_changed``: suite tests that
    passed before whose doctests the patch rewrote (their pass checks the patch's expectation, so
    the suite is not verified; a target test's is in ``weakened``)."""
    still = sorted(_failing(suite_before) & _failing(suite_after)) if suite_after is not None else []
    doctests_changed = doctests_changed or []
    changed = tests_changed or []
    problems = target_problems(target_before, target_after)
    held_out_fails = bool(problems) or not target_passes(target_before, target_after)
    as_handed = handed_back.problem(target_before) if handed_back is not None else None
    if held_out_fails and handed_back is not None and as_handed is None and changed:
        shown = ", ".join(f"{t} ({what})" for t, what in list(problems.items())[:10]) or (
            f"the run ended with exit code {target_after.exit_code}"
        )
        if weakened:
            return Judgement(
                Verdict.TESTS_WEAKENED,
                ExitCode.FAILURE,
                "the target passes, but its tests were weakened: " + "; ".join(weakened[:5]),
                weakened=weakened,
                target_not_passing=problems,
                tests_changed=changed,
            )
        return Judgement(
            Verdict.TESTS_CHANGED,
            ExitCode.FAILURE,
            "the target passes only with the patch's own changes to its tests or their harness ("
            + ", ".join(changed[:10])
            + f"); with the starting commit's tests: {shown}",
            target_not_passing=problems,
            tests_changed=changed,
        )
    if target_after.timed_out or (target_after.problem and not target_after.outcomes):
        why = "timed out" if target_after.timed_out else _first_line(target_after.problem or "")
        return Judgement(
            Verdict.NOT_FIXED, ExitCode.FAILURE, f"the target tests could not be run after the change: {why}"
        )
    if held_out_fails:
        shown = ", ".join(f"{t} ({what})" for t, what in list(problems.items())[:10])
        return Judgement(
            Verdict.NOT_FIXED,
            ExitCode.FAILURE,
            "the agent finished, but the target does not pass: "
            + (shown or f"the run ended with exit code {target_after.exit_code}")
            + (f"; on the patch as handed back: {as_handed}" if as_handed and changed else ""),
            still_failing=still,
            target_not_passing=problems,
            tests_changed=changed,
        )
    if as_handed is not None:
        return Judgement(
            Verdict.NOT_FIXED,
            ExitCode.FAILURE,
            f"the target passes with the starting commit's tests, but not on the patch as handed back: {as_handed}",
            still_failing=still,
            tests_changed=changed,
        )
    if weakened:
        return Judgement(
            Verdict.TESTS_WEAKENED,
            ExitCode.FAILURE,
            "the target passes, but its tests were weakened: " + "; ".join(weakened[:5]),
            still_failing=still,
            weakened=weakened,
            tests_changed=changed,
        )
    assert suite_after is not None
    gaps = suite_gaps(suite_before, suite_after, environment_errors)
    broke = (
        []
        if any("timed out" in g or "could not be run" in g for g in gaps)
        else [t for t in regressions(suite_before, suite_after) if t not in flaky]
    )
    if doctests_changed:
        gaps.append(
            f"{len(doctests_changed)} test(s) that passed before are doctests the patch rewrote, so they "
            f"check its expectations, not the ones they had: {'; '.join(doctests_changed[:5])}"
        )
    if flaky:
        gaps.append(
            f"{len(flaky)} test(s) that passed before failed after the change and passed when run again "
            f"(flaky, so unchecked): {', '.join(sorted(flaky)[:5])}"
        )
    gone_as_handed, new_failing = (
        handed_back.broken([target_before, suite_before]) if handed_back else ([], [])
    )
    if broke or gone_as_handed:
        as_handed_outcomes = handed_back.tests.outcomes if handed_back and handed_back.tests else {}
        shown = ", ".join(
            [f"{t} ({suite_after.outcomes.get(t, 'gone')})" for t in broke]
            + [
                f"{t} ({as_handed_outcomes.get(t, 'gone')}, as handed back)"
                for t in gone_as_handed
                if t not in broke
            ][:10]
        )
        return Judgement(
            Verdict.NOT_FIXED,
            ExitCode.FAILURE,
            f"the target passes now, but tests that passed before do not: {shown}",
            regressions=sorted({*broke, *gone_as_handed}),
            still_failing=still,
            tests_changed=changed,
        )
    if new_failing:
        return Judgement(
            Verdict.NOT_FIXED,
            ExitCode.FAILURE,
            "the target passes, but tests the patch adds fail: " + ", ".join(new_failing[:10]),
            still_failing=still,
            tests_changed=changed,
        )
    if not files_changed:
        return Judgement(
            Verdict.NOT_FIXED,
            ExitCode.FAILURE,
            "the agent changed no file, yet the target passes now (a flaky test?)",
        )
    if gaps:
        return Judgement(
            Verdict.FIXED_UNVERIFIED,
            ExitCode.SUITE_UNVERIFIED,
            "the target passes, but the rest of the suite is unverified: " + "; ".join(gaps),
            still_failing=still,
            unverified=gaps,
            tests_changed=changed,
        )
    return Judgement(
        Verdict.FIXED,
        ExitCode.OK,
        "fixed: the target passes and no test that passed before fails"
        + (f" ({len(still)} failed before and still fail)" if still else ""),
        still_failing=still,
        tests_changed=changed,
    )
