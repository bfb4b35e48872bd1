"""The verdict of a run: never more than was checked.

:func:`judge` reads the test runs before and after the patch (the after-runs are made on the exact
patched tree, held out first: :mod:`clover_agent.handback.heldout`) and picks one :class:`Verdict`
by an ordered table of small rules (:data:`RULES`, each a judgement or nothing; none: ``fixed``):
``fixed, suite unverified``, ``tests changed``, ``tests weakened`` (:mod:`~clover_agent.handback.weakened`)
or ``not fixed``; ``needs review`` comes after, from :mod:`clover_agent.handback.checks`. Each is
in README's "Verdicts" table with its exit code. Tests that failed before and still fail are listed
either way (``still_failing``), and so are target tests skipped before and after (``skipped``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
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
    """Each target test that is not a pass after the change, with what it is: "failed", "error",
    "skipped" or "gone" (not run at all: deselected, renamed or deleted).

    Not target tests: a module that could not be collected before either (it holds none that ran; the
    suite's verdict counts it, :func:`suite_gaps`), and a test skipped before and after
    (:func:`skipped_throughout`: a parametrized case skipped where it runs). A test skipped only after
    the change is a problem.
    """
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


@dataclass(frozen=True)
class Runs:
    """What a verdict is read from (:func:`judge`'s arguments), and what the rules derive from it.

    - ``target_after``, ``suite_after``: the held-out runs (the starting commit's tests over the
      patched source); ``handed_back``: the runs on the patch as handed back (None: the same tree).
    - ``tests_changed``: the paths the held-out run put back; ``weakened``: how target tests were
      weakened; ``flaky``: tests that broke in the held-out suite run and passed when run again.
    - ``doctests_changed``: suite tests that passed before whose doctests the patch rewrote.
    """

    target_before: TestReport
    target_after: TestReport
    suite_before: TestReport
    suite_after: TestReport | None
    files_changed: list[str]
    weakened: list[str]
    environment_errors: set[str]
    handed_back: HandedBack | None = None
    tests_changed: list[str] = field(default_factory=list)
    flaky: set[str] | frozenset[str] = frozenset()
    doctests_changed: list[str] = field(default_factory=list)

    @property
    def still(self) -> list[str]:
        """Tests that failed before and still fail (listed whatever the verdict)."""
        if self.suite_after is None:
            return []
        return sorted(_failing(self.suite_before) & _failing(self.suite_after))

    @property
    def problems(self) -> dict[str, str]:
        return target_problems(self.target_before, self.target_after)

    @property
    def held_out_fails(self) -> bool:
        return bool(self.problems) or not target_passes(self.target_before, self.target_after)

    @property
    def as_handed(self) -> str | None:
        """Why the target does not pass on the patch as handed back (None: it does, or no such run)."""
        return self.handed_back.problem(self.target_before) if self.handed_back is not None else None

    def shown_problems(self) -> str:
        return ", ".join(f"{t} ({what})" for t, what in list(self.problems.items())[:10]) or (
            f"the run ended with exit code {self.target_after.exit_code}"
        )


#: A rule reads the runs and gives the verdict, or None to leave it to the next rule.
Rule = Callable[[Runs], "Judgement | None"]


def _passes_only_with_changed_tests(runs: Runs) -> Judgement | None:
    """The target passes as handed back but not held out, and the patch changed what judges it."""
    if not (
        runs.held_out_fails and runs.handed_back is not None and runs.as_handed is None and runs.tests_changed
    ):
        return None
    if runs.weakened:
        return Judgement(
            Verdict.TESTS_WEAKENED,
            ExitCode.FAILURE,
            "the target passes, but its tests were weakened: " + "; ".join(runs.weakened[:5]),
            weakened=runs.weakened,
            target_not_passing=runs.problems,
            tests_changed=runs.tests_changed,
        )
    return Judgement(
        Verdict.TESTS_CHANGED,
        ExitCode.FAILURE,
        "the target passes only with the patch's own changes to its tests or their harness ("
        + ", ".join(runs.tests_changed[:10])
        + f"); with the starting commit's tests: {runs.shown_problems()}",
        target_not_passing=runs.problems,
        tests_changed=runs.tests_changed,
    )


def _target_could_not_run(runs: Runs) -> Judgement | None:
    after = runs.target_after
    if not (after.timed_out or (after.problem and not after.outcomes)):
        return None
    why = "timed out" if after.timed_out else _first_line(after.problem or "")
    return Judgement(
        Verdict.NOT_FIXED, ExitCode.FAILURE, f"the target tests could not be run after the change: {why}"
    )


def _target_fails_held_out(runs: Runs) -> Judgement | None:
    if not runs.held_out_fails:
        return None
    as_handed = runs.as_handed
    return Judgement(
        Verdict.NOT_FIXED,
        ExitCode.FAILURE,
        "the agent finished, but the target does not pass: "
        + runs.shown_problems()
        + (f"; on the patch as handed back: {as_handed}" if as_handed and runs.tests_changed else ""),
        still_failing=runs.still,
        target_not_passing=runs.problems,
        tests_changed=runs.tests_changed,
    )


def _target_fails_as_handed_back(runs: Runs) -> Judgement | None:
    if runs.as_handed is None:
        return None
    return Judgement(
        Verdict.NOT_FIXED,
        ExitCode.FAILURE,
        f"the target passes with the starting commit's tests, but not on the patch as handed back: {runs.as_handed}",
        still_failing=runs.still,
        tests_changed=runs.tests_changed,
    )


def _tests_weakened(runs: Runs) -> Judgement | None:
    if not runs.weakened:
        return None
    return Judgement(
        Verdict.TESTS_WEAKENED,
        ExitCode.FAILURE,
        "the target passes, but its tests were weakened: " + "; ".join(runs.weakened[:5]),
        still_failing=runs.still,
        weakened=runs.weakened,
        tests_changed=runs.tests_changed,
    )


def _gaps(runs: Runs) -> list[str]:
    """Why the suite's runs check less than the whole suite, with the patch's doctests and the flaky."""
    assert runs.suite_after is not None
    gaps = suite_gaps(runs.suite_before, runs.suite_after, runs.environment_errors)
    if runs.doctests_changed:
        gaps.append(
            f"{len(runs.doctests_changed)} test(s) that passed before are doctests the patch rewrote, so they "
            f"check its expectations, not the ones they had: {'; '.join(runs.doctests_changed[:5])}"
        )
    if runs.flaky:
        gaps.append(
            f"{len(runs.flaky)} test(s) that passed before failed after the change and passed when run again "
            f"(flaky, so unchecked): {', '.join(sorted(runs.flaky)[:5])}"
        )
    return gaps


def _regressions(runs: Runs) -> Judgement | None:
    """Tests that passed before and do not now (held out, or in a test file the patch changes)."""
    suite_after = runs.suite_after
    assert suite_after is not None
    gaps = suite_gaps(runs.suite_before, suite_after, runs.environment_errors)
    broke = (
        []
        if any("timed out" in g or "could not be run" in g for g in gaps)
        else [t for t in regressions(runs.suite_before, suite_after) if t not in runs.flaky]
    )
    handed_back = runs.handed_back
    gone_as_handed = handed_back.broken([runs.target_before, runs.suite_before])[0] if handed_back else []
    if not (broke or gone_as_handed):
        return None
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
        still_failing=runs.still,
        tests_changed=runs.tests_changed,
    )


def _new_tests_fail(runs: Runs) -> Judgement | None:
    handed_back = runs.handed_back
    new_failing = handed_back.broken([runs.target_before, runs.suite_before])[1] if handed_back else []
    if not new_failing:
        return None
    return Judgement(
        Verdict.NOT_FIXED,
        ExitCode.FAILURE,
        "the target passes, but tests the patch adds fail: " + ", ".join(new_failing[:10]),
        still_failing=runs.still,
        tests_changed=runs.tests_changed,
    )


def _nothing_changed(runs: Runs) -> Judgement | None:
    if runs.files_changed:
        return None
    return Judgement(
        Verdict.NOT_FIXED,
        ExitCode.FAILURE,
        "the agent changed no file, yet the target passes now (a flaky test?)",
    )


def _suite_unverified(runs: Runs) -> Judgement | None:
    gaps = _gaps(runs)
    if not gaps:
        return None
    return Judgement(
        Verdict.FIXED_UNVERIFIED,
        ExitCode.SUITE_UNVERIFIED,
        "the target passes, but the rest of the suite is unverified: " + "; ".join(gaps),
        still_failing=runs.still,
        unverified=gaps,
        tests_changed=runs.tests_changed,
    )


def _fixed(runs: Runs) -> Judgement:
    still = runs.still
    return Judgement(
        Verdict.FIXED,
        ExitCode.OK,
        "fixed: the target passes and no test that passed before fails"
        + (f" ({len(still)} failed before and still fail)" if still else ""),
        still_failing=still,
        tests_changed=runs.tests_changed,
    )


#: The verdict's rules, in order: the first that gives a judgement decides; none does: ``fixed``.
RULES: tuple[Rule, ...] = (
    _passes_only_with_changed_tests,
    _target_could_not_run,
    _target_fails_held_out,
    _target_fails_as_handed_back,
    _tests_weakened,
    _regressions,
    _new_tests_fail,
    _nothing_changed,
    _suite_unverified,
)


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
    """The verdict (see the module docstring): the first of :data:`RULES` that gives one, else
    ``fixed``. The arguments are :class:`Runs`'s."""
    runs = Runs(
        target_before,
        target_after,
        suite_before,
        suite_after,
        files_changed,
        weakened,
        environment_errors,
        handed_back,
        tests_changed or [],
        flaky,
        doctests_changed or [],
    )
    for rule in RULES:
        judged = rule(runs)
        if judged is not None:
            return judged
    return _fixed(runs)
