"""cargo: ``Cargo.toml``. Best effort: ``test NAME ... ok|FAILED|ignored`` lines."""

from __future__ import annotations

import re

from clover_agent.sandboxes.base import OutputSink, Sandbox
from clover_agent.tools.run_tests.report import (
    TestFailure,
    TestReport,
    no_results,
    run_command,
    trim_traceback,
)
from clover_agent.tools.run_tests.targets import Target

_CARGO_LINE = re.compile(r"^test (?P<name>\S+) \.\.\. (?P<status>ok|FAILED|ignored)", re.MULTILINE)
_CARGO_SECTION = re.compile(
    r"^---- (?P<name>\S+) stdout ----\n(?P<body>.*?)(?=^---- |^failures:$)", re.MULTILINE | re.DOTALL
)


def parse_cargo_output(output: str, report: TestReport) -> None:
    for m in _CARGO_LINE.finditer(output):
        report.outcomes[m["name"]] = {"ok": "passed", "FAILED": "failed", "ignored": "skipped"}[m["status"]]
    for m in _CARGO_SECTION.finditer(output):
        body = m["body"].strip("\n")
        message = next((x.strip() for x in body.splitlines() if "panicked at" not in x and x.strip()), "")
        report.failures.append(TestFailure(m["name"], "failed", message, trim_traceback(body)))
    for outcome in report.outcomes.values():
        setattr(report, outcome, getattr(report, outcome) + 1)


def cargo_command(target: Target | None) -> list[str]:
    """``cargo test --offline`` with the test-name filters (the ``-k`` expression or the words)."""
    if target is None:
        return ["cargo", "test", "--offline"]
    filters = [target.expression] if target.expression is not None else list(target.words)
    if len(filters) == 1:
        return ["cargo", "test", "--offline", filters[0]]
    return ["cargo", "test", "--offline", "--", *filters]  # libtest takes several filters


async def run_cargo(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    *,
    on_output: OutputSink | None = None,
) -> TestReport:
    report, result = await run_command(
        sandbox, "cargo", cargo_command(target), shown_target, timeout, on_output
    )
    parse_cargo_output(result.output, report)
    if report.total == 0:
        report.problem = no_results(result, "no `cargo test` results were found in the output")
    return report
