"""What a ``fix`` run found: each phase's value, the report built once from them, and its summary file.

:func:`clover_agent.fix.workflow.run_fix` keeps the value each phase returns (:class:`Before`,
the agent's ``RunResult``, :class:`Kept`, :class:`Checked`) and builds the frozen
:class:`FixReport` from them with :func:`build_report`, on every way out. Front ends and the
hand-back only read it; the hand-back's :class:`HandBackOutcome` joins it in a new value
(:meth:`FixReport.with_outcome`), and :func:`write_summary` is the one writer of ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from clover_agent.agent.loop import RunResult
from clover_agent.agent.records import RecordKey
from clover_agent.agent.trajectory import TRAJECTORY_FILE
from clover_agent.errors import CloverError, ExitCode
from clover_agent.fix.runs import PATCH_FILE, SUMMARY_FILE
from clover_agent.handback.judging import Checked, Judging
from clover_agent.handback.patches import is_test_file
from clover_agent.handback.stock import Kept, PatchSet, Stock
from clover_agent.handback.verdict import Verdict
from clover_agent.sandboxes.errors import SandboxError
from clover_agent.tools.run_tests import TestReport


class Mode(StrEnum):
    """How the tests to fix were chosen."""

    TARGET = "target"  # TARGET's tests
    FAILING_TESTS = "failing tests"  # the suite's failing tests (no TARGET)
    REQUEST = "request"  # none failed: the change is the request's


class HandBack(StrEnum):
    """What became of the patch in the user's working tree."""

    APPLIED = "applied"
    DRY_RUN = "dry run"
    DECLINED = "declined"
    NOTHING_TO_APPLY = "nothing to apply"
    NO_TERMINAL = "no terminal to confirm"
    REFUSED = "refused"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


@dataclass(frozen=True)
class HandBackOutcome:
    """The hand-back's result: the command's exit code and message (empty: the report's says it)
    and what became of the patch (None: none was offered), with its detail (why it was refused,
    which files were not applied)."""

    exit_code: ExitCode
    message: str = ""
    kind: HandBack | None = None
    detail: str = ""
    #: When only part of the verified patch was to be applied: that part's own verification (in a
    #: fresh sandbox, held out), whose verdict is then the run's, and its files.
    subset: Checked | None = None
    subset_files: tuple[str, ...] = ()

    @property
    def hand_back(self) -> str | None:
        """As ``summary.json`` says it: e.g. "applied", "dry run", "refused: <why>"."""
        if self.kind is None:
            return None
        return f"{self.kind}: {self.detail}" if self.detail else str(self.kind)


@dataclass(frozen=True)
class Before:
    """Steps 1 and 2: how the tests to fix were chosen and their runs before the change, the
    workflow's task for the agent, and why the run stops here when it does (nothing to fix, the
    environment not ready, tests that cannot run)."""

    mode: Mode | None = None  # None: not known (a resumed run, or no test found)
    selection: str = ""  # "<tests> (<how they were found>)"
    target_tests: str = ""  # a ``run_tests`` target; "": the request alone says what to do
    target_before: TestReport | None = None
    suite_before: TestReport | None = None
    task: str = ""  # "": a resumed run (its task is in the recorded conversation)
    stop: CloverError | SandboxError | None = None  # SandboxError: it broke after a test run


_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class FixReport:
    """A ``fix`` run's result, built once (:func:`build_report`); never changed after."""

    run_id: str
    run_dir: Path
    exit_code: ExitCode = ExitCode.FAILURE
    message: str = ""
    mode: Mode | None = None  # None: not known (summary.json says "")
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
    harness: tuple[str, ...] = ()
    tests_changed: tuple[str, ...] = ()
    regressions: tuple[str, ...] = ()
    #: Working from a request with no failing test: the changed tests run on the starting code with
    #: only the patch's test files, and the tests that pass with the change and not without it.
    without_change: TestReport | None = None
    shown_by: tuple[str, ...] = ()
    agent: RunResult | None = None
    backend: str = ""
    files_changed: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    #: What the hand-back did (:meth:`with_outcome`); None until then.
    outcome: HandBackOutcome | None = None
    verdict: Verdict | None = None  # None: the run ended before one (the exit code says why)
    still_failing: tuple[str, ...] = ()  # failed before and after the change
    target_skipped: tuple[str, ...] = ()  # target tests skipped before and after: not checked
    unverified: tuple[str, ...] = ()  # why the suite's run is not a full check
    weakened: tuple[str, ...] = ()  # how the target's tests were weakened
    target_not_passing: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    #: What the checks of how the target passes found (a fixed verdict with any: ``needs review``),
    #: and what each check did (:mod:`clover_agent.handback.checks`).
    review: tuple[str, ...] = ()
    checks: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _EMPTY)
    #: The patch made on the host (None when the workspace could not be read back).
    patch_set: PatchSet | None = None
    stock: Stock | None = None
    key: RecordKey | None = None  # signs the RECORD_FILES
    #: What the patch was judged against (a part of it is judged against the same at the hand-back).
    judging: Judging | None = None
    #: The verdict of the whole patch when only part of it was verified again and judged
    #: (``verdict`` is then that part's: it describes the bytes that reach the tree).
    whole_verdict: Verdict | None = None
    subset_files: tuple[str, ...] = ()

    @property
    def fixed(self) -> bool:
        """The patch makes the target pass (the suite's check may be incomplete: see ``verdict``)."""
        return self.verdict is not None and self.verdict.fixed

    @property
    def hand_back(self) -> str | None:
        return None if self.outcome is None else self.outcome.hand_back

    @property
    def left_out(self) -> dict[str, str]:
        return {} if self.patch_set is None else dict(self.patch_set.left_out)

    @property
    def patch_path(self) -> Path:
        return self.run_dir / PATCH_FILE

    @property
    def trajectory_path(self) -> Path:
        return self.run_dir / TRAJECTORY_FILE

    @property
    def test_files_changed(self) -> list[str]:
        return [f for f in self.files_changed if is_test_file(f)]

    def with_outcome(self, outcome: HandBackOutcome) -> FixReport:
        """The report the command ends with: the hand-back's exit code and message (an empty one
        keeps the verdict's) and what became of the patch; when part of the patch was verified on
        its own (``outcome.subset``), that part's verdict and runs."""
        report = self
        if outcome.subset is not None:
            report = dataclasses.replace(
                self,
                whole_verdict=self.verdict,
                subset_files=outcome.subset_files,
                **_checked_fields(outcome.subset),
            )
        return dataclasses.replace(
            report, exit_code=outcome.exit_code, message=outcome.message or report.message, outcome=outcome
        )

    def to_dict(self) -> dict[str, Any]:
        def counts(report: TestReport | None) -> dict[str, Any] | None:
            if report is None:
                return None
            return {k: getattr(report, k) for k in ("passed", "failed", "errors", "skipped", "outcomes")}

        patch = None if self.patch_set is None else self.patch_set.to_dict()
        return {
            "run_id": self.run_id,
            "fixed": self.fixed,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "mode": "" if self.mode is None else self.mode.value,
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
            "harness": list(self.harness),
            "tests_changed": list(self.tests_changed),
            "verdict": "" if self.verdict is None else self.verdict.value,
            # part of the patch verified on its own at the hand-back: "verdict" is that part's
            "subset": None
            if self.whole_verdict is None
            else {"files": list(self.subset_files), "whole_patch_verdict": self.whole_verdict.value},
            "regressions": list(self.regressions),
            "still_failing": list(self.still_failing),
            "target_skipped": list(self.target_skipped),
            "unverified": list(self.unverified),
            "weakened": list(self.weakened),
            "target_not_passing": dict(self.target_not_passing),
            "review": list(self.review),
            "checks": dict(self.checks),
            "shown_by": list(self.shown_by),
            "files_changed": list(self.files_changed),
            "test_files_changed": self.test_files_changed,
            "changes": [] if patch is None else patch["changes"],
            "left_out": self.left_out,
            "needs_yes": {} if patch is None else patch["needs_yes"],
            "agent": None
            if self.agent is None
            else {
                "outcome": self.agent.outcome,
                "summary": self.agent.summary,
                "blocked": self.agent.blocked or None,
                **self.agent.stats,
            },
            "backend": self.backend,
            "elapsed_s": round(self.elapsed_s, 3),
            "hand_back": self.hand_back,
            "patch": str(self.patch_path),
            "trajectory": str(self.trajectory_path),
        }


def build_report(
    run_id: str,
    run_dir: Path,
    *,
    exit_code: ExitCode,
    message: str,
    elapsed_s: float,
    key: RecordKey | None = None,
    stock: Stock | None = None,
    before: Before | None = None,
    backend: str = "",
    agent: RunResult | None = None,
    kept: Kept | None = None,
    checked: Checked | None = None,
    judging: Judging | None = None,
) -> FixReport:
    """The report from the phases' values (those a run that ended early never reached are None)
    and the run's exit code and message."""
    before = before or Before()
    patch_set = None if kept is None else kept.patch_set
    return FixReport(
        run_id,
        run_dir,
        exit_code=exit_code,
        message=message,
        mode=before.mode,
        selection=before.selection,
        target_before=before.target_before,
        suite_before=before.suite_before,
        agent=agent,
        backend=backend,
        files_changed=() if patch_set is None else tuple(patch_set.files),
        elapsed_s=elapsed_s,
        patch_set=patch_set,
        stock=stock,
        key=key,
        judging=judging,
        **_checked_fields(checked),
    )


def _checked_fields(checked: Checked | None) -> dict[str, Any]:
    """The report's fields that step 4 (``checked``: its runs, evidence and verdict) gives, for
    :func:`build_report` and, when part of the patch was verified again, :meth:`FixReport.with_outcome`."""
    runs = None if checked is None else checked.runs
    handed_back = None if runs is None else runs.handed_back
    shown = None if checked is None else checked.shown
    judged = None if checked is None else checked.judged
    return {
        "target_after": None if runs is None else runs.target_after,
        "suite_after": None if runs is None else runs.suite_after,
        "target_handed_back": None if handed_back is None else handed_back.target,
        "tests_handed_back": None if handed_back is None else handed_back.tests,
        "harness": () if runs is None else tuple(runs.harness),
        "tests_changed": () if judged is None else tuple(judged.tests_changed),
        "regressions": () if judged is None else tuple(judged.regressions),
        "without_change": None if shown is None else shown.without_change,
        "shown_by": () if shown is None else shown.shown_by,
        "verdict": None if judged is None else judged.verdict,
        "still_failing": () if judged is None else tuple(judged.still_failing),
        "target_skipped": () if judged is None else tuple(judged.skipped),
        "unverified": () if judged is None else tuple(judged.unverified),
        "weakened": () if judged is None else tuple(judged.weakened),
        "target_not_passing": _EMPTY if judged is None else MappingProxyType(dict(judged.target_not_passing)),
        "review": () if judged is None else tuple(judged.review),
        "checks": _EMPTY if runs is None else MappingProxyType(dict(runs.checks)),
    }


def write_summary(report: FixReport) -> dict[str, Any]:
    """Write ``summary.json`` (and sign it and the patch with the report's key); returns what was
    written. The workflow writes it when the run ends, the hand-back again with its outcome."""
    summary = report.to_dict()
    (report.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if report.key is not None:
        for name in (SUMMARY_FILE, PATCH_FILE):
            if (report.run_dir / name).is_file():
                report.key.sign(report.run_dir, name)
    return summary
