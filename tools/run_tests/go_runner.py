"""go: ``go.mod``. ``go test -json``: one JSON event per line, so per-test outcomes are exact."""

from __future__ import annotations

import json

from clover_agent.sandboxes.base import OutputSink, Sandbox
from clover_agent.tools.run_tests.report import (
    TestFailure,
    TestReport,
    no_results,
    run_command,
    trim_traceback,
)
from clover_agent.tools.run_tests.targets import Target


def parse_go_json(output: str, report: TestReport) -> None:
    """Fill ``report`` from ``go test -json`` events (per-test pass/fail/skip with output)."""
    test_output: dict[str, list[str]] = {}
    for line in output.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict) or not event.get("Test"):
            continue
        test_id = f"{event.get('Package', '')}.{event['Test']}"
        action = event.get("Action")
        if action == "output":
            test_output.setdefault(test_id, []).append(event.get("Output", ""))
        elif action in ("pass", "fail", "skip"):
            report.outcomes[test_id] = {"pass": "passed", "fail": "failed", "skip": "skipped"}[action]
            if action == "fail":
                text = "".join(test_output.get(test_id, []))
                lines = [x.strip() for x in text.splitlines()]
                message = next((x for x in lines if x and not x.startswith(("=== ", "--- "))), "")
                report.failures.append(TestFailure(test_id, "failed", message, trim_traceback(text)))
    for outcome in report.outcomes.values():
        setattr(report, outcome, getattr(report, outcome) + 1)


def go_command(target: Target | None) -> list[str]:
    """``go test -json``: package paths (words starting with ``.`` or holding ``/``), and test names
    or the ``-k`` expression as one ``-run=`` pattern (joined with ``|``); all packages by default."""
    names = [] if target is None else [w for w in target.words if not (w.startswith(".") or "/" in w)]
    packages = [] if target is None else [w for w in target.words if w not in names]
    if target is not None and target.expression is not None:
        names = [target.expression]
    run = [f"-run={'|'.join(names)}"] if names else []
    return ["go", "test", "-json", *run, *(packages or ["./..."])]


async def run_go(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    *,
    on_output: OutputSink | None = None,
) -> TestReport:
    report, result = await run_command(sandbox, "go", go_command(target), shown_target, timeout, on_output)
    parse_go_json(result.output, report)
    report.structured = True
    if report.total == 0:
        report.problem = no_results(result, "`go test -json` reported no tests")
    return report
