"""The ``fix`` report is one-way: built once from the phases' values, frozen, read by everyone
else; its verdict, mode and hand-back outcome are enums whose values are the documented strings."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from clover_agent.errors import CloverError, ExitCode
from clover_agent.fix.report import (
    Before,
    Checked,
    FixReport,
    HandBack,
    HandBackOutcome,
    Mode,
    build_report,
    write_summary,
)
from clover_agent.handback.verdict import Judgement, Verdict
from clover_agent.tools.run_tests import TestReport

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "clover_agent"
#: The one module that makes a FixReport (in :func:`build_report`) and a new one with the outcome.
REPORT_MODULE = PACKAGE / "fix" / "report.py"
#: What a writer would assign: the fields, and the properties (``report.hand_back`` was a field).
FIELDS = frozenset(f.name for f in dataclasses.fields(FixReport)) | {
    name for name, value in vars(FixReport).items() if isinstance(value, property)
}


def _run(outcomes: dict[str, str]) -> TestReport:
    passed, failed = (sum(1 for o in outcomes.values() if o == what) for what in ("passed", "failed"))
    return TestReport(
        "pytest", "pytest", None, int(failed > 0), passed=passed, failed=failed, outcomes=outcomes
    )


def _report(tmp_path: Path) -> FixReport:
    before = Before(
        Mode.TARGET, "t.py (named)", "t.py", _run({"t.py::a": "failed"}), _run({"t.py::b": "passed"})
    )
    judged = Judgement(Verdict.FIXED, ExitCode.OK, "fixed", still_failing=["t.py::c"])
    return build_report(
        "r1",
        tmp_path,
        exit_code=ExitCode.OK,
        message="fixed",
        elapsed_s=1.5,
        before=before,
        checked=Checked(judged),
    )


def test_the_report_is_frozen(tmp_path: Path) -> None:
    report = _report(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.verdict = Verdict.NOT_FIXED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.hand_back = "applied"  # type: ignore[misc]
    # Its lists are tuples and its mapping read-only: nothing in it changes in place either.
    assert report.still_failing == ("t.py::c",)
    with pytest.raises(TypeError):
        report.target_not_passing["t.py::a"] = "failed"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Judgement(Verdict.FIXED, ExitCode.OK, "").verdict = Verdict.NOT_FIXED  # type: ignore[misc]


def test_the_outcome_makes_a_new_report(tmp_path: Path) -> None:
    report = _report(tmp_path)
    outcome = HandBackOutcome(ExitCode.FAILURE, "it was not applied", HandBack.REFUSED, "uncommitted changes")
    final = report.with_outcome(outcome)
    assert (final.exit_code, final.message, final.hand_back) == (
        ExitCode.FAILURE,
        "it was not applied",
        "refused: uncommitted changes",
    )
    assert (report.exit_code, report.message, report.hand_back) == (ExitCode.OK, "fixed", None)
    # An outcome with nothing more to say keeps the verdict's message.
    assert report.with_outcome(HandBackOutcome(ExitCode.OK, kind=HandBack.DRY_RUN)).message == "fixed"


def test_the_summary_holds_the_documented_strings(tmp_path: Path) -> None:
    report = _report(tmp_path).with_outcome(
        HandBackOutcome(ExitCode.OK, kind=HandBack.APPLIED, detail="a.py; not applied: b.py")
    )
    written = write_summary(report)
    read = json.loads((tmp_path / "summary.json").read_text())
    assert read == json.loads(json.dumps(written))
    assert (read["verdict"], read["mode"], read["fixed"], read["exit_code"]) == ("fixed", "target", True, 0)
    assert read["hand_back"] == "applied: a.py; not applied: b.py"
    assert read["still_failing"] == ["t.py::c"] and read["target"] == "t.py (named)"
    assert read["tests"]["target_before"]["failed"] == 1 and read["tests"]["target_after"] is None
    # The values in memory are plain strings, as every subscriber of the TaskFinished event expects.
    assert type(written["verdict"]) is str and type(written["mode"]) is str


def test_a_run_that_stopped_early_says_so_with_no_verdict(tmp_path: Path) -> None:
    before = Before(suite_before=_run({"t.py::b": "passed"}), stop=CloverError("nothing to fix"))
    report = build_report(
        "r2",
        tmp_path,
        exit_code=ExitCode.NOTHING_TO_FIX,
        message="nothing to fix",
        elapsed_s=0.1,
        before=before,
    )
    summary = report.to_dict()
    assert (summary["verdict"], summary["mode"], summary["fixed"], summary["hand_back"]) == (
        "",
        "",
        False,
        None,
    )
    assert summary["tests"]["suite_before"]["passed"] == 1 and summary["exit_code"] == 5


def test_the_enums_values_are_the_documented_strings() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("### Verdicts", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `([^`]+)` \| (\d+) \|", table, re.M)
    assert [v.value for v in Verdict] == [
        "fixed",
        "fixed, suite unverified",
        "tests changed",
        "tests weakened",
        "not fixed",
        "needs review",
    ]
    assert sorted(v for v, _ in documented) == sorted(Verdict)
    assert all(Verdict(v) == v for v, _ in documented)
    assert [v for v in Verdict if v.fixed] == [Verdict.FIXED, Verdict.FIXED_UNVERIFIED]
    assert [m.value for m in Mode] == ["target", "failing tests", "request"]
    assert [h.value for h in HandBack] == [
        "applied",
        "dry run",
        "declined",
        "nothing to apply",
        "no terminal to confirm",
        "refused",
        "interrupted",
        "failed",
    ]


# -- the one-way rule, checked on the package's syntax trees ----------------------------------------


def _name(node: ast.expr) -> str:
    """The last name of ``node`` (``self.report`` -> ``report``), "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        else:
            flat.append(target)
    return flat


def one_way_violations(source: str, path: str, *, builder_module: bool = False) -> list[str]:
    """Where ``source`` writes a report: a FixReport made outside :func:`build_report`, a report's
    field assigned (``report.verdict = ...``, ``setattr``/``object.__setattr__`` on a report), or a
    changed copy made (``dataclasses.replace(report, ...)``) outside the report module."""
    found = []
    tree = ast.parse(source)
    builders = {
        id(call)
        for fn in ast.walk(tree)
        if builder_module and isinstance(fn, ast.FunctionDef) and fn.name == "build_report"
        for call in ast.walk(fn)
    }
    for node in ast.walk(tree):
        for target in _targets(node):
            if (
                isinstance(target, ast.Attribute)
                and target.attr in FIELDS
                and "report" in _name(target.value)
            ):
                found.append(f"{path}:{target.lineno}: assigns {ast.unparse(target)}")
        if not isinstance(node, ast.Call):
            continue
        called = _name(node.func)
        if called == "FixReport" and id(node) not in builders:
            found.append(f"{path}:{node.lineno}: makes a FixReport outside build_report")
        first = _name(node.args[0]) if node.args else ""
        owner = _name(node.func.value) if isinstance(node.func, ast.Attribute) else ""
        if called in ("setattr", "__setattr__") and ("report" in first or "report" in owner):
            found.append(f"{path}:{node.lineno}: sets an attribute of a report")
        if called == "replace" and "report" in first and not builder_module:
            found.append(f"{path}:{node.lineno}: makes a changed copy of a report")
    return found


def test_nothing_but_the_builder_writes_a_report() -> None:
    found, made = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        found += one_way_violations(source, str(path.relative_to(ROOT)), builder_module=path == REPORT_MODULE)
        made += sum(
            1
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _name(node.func) == "FixReport"
        )
    assert found == []
    assert made == 1  # the check reads the real tree: build_report's one FixReport(...)


def test_the_one_way_check_finds_writes() -> None:
    """The old ways of changing a report, each found."""
    old = """
def finish(report, j, patch):
    report.verdict, report.exit_code = j.verdict, j.exit_code
    report.message += " (left out)"
    self.report.hand_back = "applied"
    setattr(report, "verdict", "fixed")
    object.__setattr__(report, "verdict", "fixed")
    return dataclasses.replace(report, message="x"), FixReport("r", patch)
"""
    found = one_way_violations(old, "old.py")
    assert len(found) == 8, found
    assert one_way_violations(old.replace("report", "run"), "old.py") == [
        "old.py:8: makes a FixReport outside build_report"
    ]
    built = "def build_report(run_id, run_dir):\n    return FixReport(run_id, run_dir)\n"
    assert one_way_violations(built, "report.py", builder_module=True) == []
    assert one_way_violations(built, "workflow.py") == [
        "workflow.py:2: makes a FixReport outside build_report"
    ]
