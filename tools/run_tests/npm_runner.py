"""npm: a ``test`` script in ``package.json``. Best effort: TAP summary lines (``# pass N``,
``# fail N``, as ``node --test`` prints them) when present, else only the exit code."""

from __future__ import annotations

import re

from clover_agent.sandboxes.base import OutputSink, Sandbox
from clover_agent.tools.base import ToolError
from clover_agent.tools.run_tests.report import (
    TestFailure,
    TestReport,
    run_command,
    trim_traceback,
)
from clover_agent.tools.run_tests.targets import Target

_TAP_NOT_OK = re.compile(r"^not ok \d+ - (?P<name>.+?)(?: # .*)?$\n(?P<block>(?:^ +.*\n|^\n)*)", re.MULTILINE)


def parse_tap_output(output: str, report: TestReport) -> bool:
    """Fill ``report`` from TAP summary lines (``# pass N``...); False when there are none."""
    counts = {
        key: re.findall(rf"^# {key} (\d+)$", output, re.MULTILINE)
        for key in ("pass", "fail", "skipped", "todo")
    }
    if not (counts["pass"] or counts["fail"]):
        return False
    last = {key: int(found[-1]) if found else 0 for key, found in counts.items()}
    report.passed, report.failed, report.skipped = last["pass"], last["fail"], last["skipped"] + last["todo"]
    for m in _TAP_NOT_OK.finditer(output):
        block = m["block"]
        error = re.search(r"^ +error: (?:\|-?\n +)?(?P<first>.+)$", block, re.MULTILINE)
        message = error["first"].strip().strip("'\"") if error else ""
        report.failures.append(TestFailure(m["name"].strip(), "failed", message, trim_traceback(block)))
    return True


def npm_command(target: Target | None) -> list[str]:
    """``npm test``, with the target's files after ``--`` (passed on to the test script)."""
    if target is not None and target.expression is not None:
        raise ToolError(
            "`npm test` has no `-k` filter; give a test file (passed on to the test script) or no target."
        )
    return ["npm", "test", "--silent", *(["--", *target.words] if target else [])]


async def run_npm(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    *,
    on_output: OutputSink | None = None,
) -> TestReport:
    report, result = await run_command(sandbox, "npm", npm_command(target), shown_target, timeout, on_output)
    if not parse_tap_output(result.output, report):
        report.problem = (
            f"`npm test` exited with code {result.exit_code}; its output has no TAP summary, so no counts "
            "are available."
        )
    return report
