"""A test run as a small table: counts, then the tests that did not pass (before → after when an
earlier run in the session knew them)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

OUTCOME_STYLE = {"passed": "green", "failed": "red bold", "error": "red bold", "skipped": "yellow"}
ROWS = 8


def _outcome(outcome: str | None) -> Text:
    if outcome is None:
        return Text("—", style="dim")
    return Text(outcome, style=OUTCOME_STYLE.get(outcome, ""))


def render_tests(report: dict[str, Any], before: dict[str, str] | None = None) -> Table:
    """``report`` is a ``TestReport.to_dict()``; ``before``: outcomes of an earlier run."""
    outcomes: dict[str, str] = report.get("outcomes") or {}
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold dim", expand=False)
    table.add_column("test", overflow="ellipsis", no_wrap=True, max_width=60)
    if before:
        table.add_column("before", no_wrap=True)
    table.add_column("now", no_wrap=True)
    changed = [t for t in outcomes if before and before.get(t) not in (None, outcomes[t])]
    failing = [t for t, o in outcomes.items() if o != "passed" and t not in changed]
    rows = [*changed, *failing][:ROWS]
    for test in rows:
        cells = [Text(test)]
        if before:
            cells.append(_outcome(before.get(test)))
        cells.append(_outcome(outcomes[test]))
        table.add_row(*cells)
    rest = len(changed) + len(failing) - len(rows)
    summary = (
        f"{report.get('passed', 0)} passed, {report.get('failed', 0)} failed, "
        f"{report.get('errors', 0)} errors, {report.get('skipped', 0)} skipped"
    )
    if report.get("problem"):
        summary += f" — {report['problem']}"
    label = Text(summary + (f" ({rest} more not shown)" if rest > 0 else ""), style="bold")
    table.add_row(label, *([Text("")] * (len(table.columns) - 1)))
    return table


class TestTable(Static):
    """Shows one test report (see :func:`render_tests`)."""

    __test__ = False  # not a pytest test class
    DEFAULT_CSS = """
    TestTable { padding: 0 1; height: auto; }
    """

    def __init__(self, report: dict[str, Any], before: dict[str, str] | None = None) -> None:
        super().__init__(render_tests(report, before))
        self.report = report
