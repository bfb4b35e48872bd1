"""unittest, for Python test files without pytest. Best effort: ``python -m unittest -v`` output
is parsed (per-test ``... ok|FAIL|ERROR|skipped`` lines and the failure sections)."""

from __future__ import annotations

import re
import shlex

from clover_agent.sandboxes.base import WORKSPACE, OutputSink, Sandbox
from clover_agent.tools.run_tests.report import (
    TestFailure,
    TestReport,
    make_report,
    no_results,
    trim_traceback,
)
from clover_agent.tools.run_tests.targets import Target

_UNITTEST_LINE = re.compile(
    r"^(?P<name>\S+) \((?P<where>[^)]*)\)(?:\n.*?)?? \.\.\. (?P<status>ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$",
    re.MULTILINE,
)
_UNITTEST_SECTION = re.compile(
    r"^={20,}\n(?P<kind>FAIL|ERROR): (?P<name>\S+) \((?P<where>[^)]*)\)\n(?:.*\n)*?-{20,}\n(?P<body>.*?)(?=^={20,}\n|^-{20,}\nRan )",
    re.MULTILINE | re.DOTALL,
)


def _dotted(word: str) -> str:
    path, _, rest = word.partition("::")
    if path.endswith(".py"):
        path = path[: -len(".py")].replace("/", ".")
    return ".".join([path, *[p for p in rest.split("::") if p]])


def unittest_target(target: Target | None) -> list[str]:
    """``unittest`` arguments (verbose): discovery, ``-k``, or dotted names from paths or node ids
    (after ``--``, so none can be an option).

    ``discover`` must come first: unittest only recognises it as the first argument.
    """
    if target is None:
        return ["discover", "-v"]
    if target.expression is not None:
        return ["discover", "-v", "-k", target.expression]
    return ["-v", "--", *(_dotted(w) for w in target.words)]


def _unittest_id(name: str, where: str) -> str:
    # Python >= 3.11 prints "test_x (module.Class.test_x)"; older ones "test_x (module.Class)".
    return where if where.endswith("." + name) else f"{where}.{name}"


def parse_unittest_output(output: str, report: TestReport) -> None:
    for m in _UNITTEST_LINE.finditer(output):
        test_id, status = _unittest_id(m["name"], m["where"]), m["status"]
        outcome = {"ok": "passed", "FAIL": "failed", "ERROR": "error", "unexpected success": "failed"}.get(
            status, "skipped"
        )
        report.outcomes[test_id] = outcome
    for m in _UNITTEST_SECTION.finditer(output):
        body = m["body"].strip("\n")
        last = body.splitlines()[-1] if body else ""
        kind = "failed" if m["kind"] == "FAIL" else "error"
        test_id = _unittest_id(m["name"], m["where"])
        report.outcomes.setdefault(test_id, kind)
        report.failures.append(TestFailure(test_id, kind, last, trim_traceback(body)))
    counts = {o: 0 for o in ("passed", "failed", "error", "skipped")}
    for outcome in report.outcomes.values():
        counts[outcome] += 1
    report.passed, report.failed, report.errors, report.skipped = (
        counts["passed"],
        counts["failed"],
        counts["error"],
        counts["skipped"],
    )


async def run_unittest(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    *,
    on_output: OutputSink | None = None,
) -> TestReport:
    args = ["-m", "unittest", *unittest_target(target)]
    command = 'py=$(command -v python3 || command -v python) && "$py" ' + shlex.join(args)
    result = await sandbox.exec(
        command, timeout=timeout, cwd=WORKSPACE, env={"PYTHONDONTWRITEBYTECODE": "1"}, on_output=on_output
    )
    report = make_report("unittest", shlex.join(["python", *args]), shown_target, result)
    parse_unittest_output(result.output, report)
    if report.total == 0:
        report.problem = no_results(result, "no unittest results were found in the output")
    return report
