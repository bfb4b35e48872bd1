"""The outcome of a test run, whatever the framework: :class:`TestReport` and :class:`TestFailure`."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from clover_agent.sandboxes.base import WORKSPACE, ExecResult, OutputSink, Sandbox
from clover_agent.tools.base import head_tail

TRACEBACK_MAX_LINES = 30
TRACEBACK_MAX_CHARS = 3000
#: A failure's message and test id are cut to this many characters in the summary.
MESSAGE_MAX_CHARS = 1000
FAILURES_SHOWN = 10


@dataclass
class TestFailure:
    test_id: str  # pytest node id (``tests/test_x.py::TestC::test_y``) or the framework's name
    kind: str  # "failed" or "error"
    message: str
    traceback: str  # trimmed to its last lines


@dataclass
class TestReport:
    """What a test run found. Counts are None when the framework's output did not say."""

    __test__ = False  # not a pytest test class, despite the name

    framework: str  # "pytest" | "unittest" | "npm" | "go" | "cargo" | "none"
    command: str
    target: str | None
    exit_code: int | None
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[TestFailure] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> passed|failed|error|skipped
    duration_s: float = 0.0
    structured: bool = False  # counts from a machine-readable report, not from console output
    timed_out: bool = False
    output: str = ""  # full console output
    problem: str | None = None  # why no test results could be read, when that happened
    #: Why the run's results cannot be trusted as they are (a forged or broken live result stream,
    #: a canary with the wrong outcome): the judge never reads ``fixed`` from such a run.
    integrity: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    @property
    def all_passed(self) -> bool:
        """Tests ran, none failed or errored, and the run itself succeeded."""
        return (
            self.problem is None
            and not self.timed_out
            and self.exit_code == 0
            and self.failed == 0
            and self.errors == 0
            and self.passed > 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "all_passed": self.all_passed}

    def summary(self) -> str:
        """The report as the model reads it."""
        how = (
            "from the JUnit XML report"
            if self.framework == "pytest" and self.structured
            else (
                "from `go test -json`" if self.structured else "parsed from the console output (best effort)"
            )
        )
        lines = [f"$ {self.command}"] if self.command else []  # no command: no framework was found
        if self.timed_out:
            lines.append(f"The test run timed out after {self.duration_s:.0f} s and was killed.")
        if self.problem:
            lines.append(self.problem)
        else:
            lines.append(
                f"{self.framework}: {self.passed} passed, {self.failed} failed, {self.errors} errors, "
                f"{self.skipped} skipped in {self.duration_s:.2f} s (exit code {self.exit_code}; counts {how})."
            )
        for failure in self.failures[:FAILURES_SHOWN]:
            test_id, message = clip(failure.test_id), clip(failure.message)
            lines.append(f"\n{failure.kind.upper()}: {test_id}\n  {message}")
            if failure.traceback:
                lines.append(failure.traceback)
        if len(self.failures) > FAILURES_SHOWN:
            lines.append(f"\n[... {len(self.failures) - FAILURES_SHOWN} more failing tests not shown ...]")
        if self.output and (
            self.problem or (not self.structured and (self.failed or self.errors or self.exit_code))
        ):
            lines.append("\nOutput:\n" + head_tail(self.output, 4096, 4096))
        return "\n".join(lines)


def trim_traceback(text: str) -> str:
    lines = text.strip("\n").splitlines()
    if len(lines) > TRACEBACK_MAX_LINES:
        lines = [f"[... {len(lines) - TRACEBACK_MAX_LINES} lines cut ...]", *lines[-TRACEBACK_MAX_LINES:]]
    out = "\n".join(lines)
    return out if len(out) <= TRACEBACK_MAX_CHARS else "[...]" + out[-TRACEBACK_MAX_CHARS:]


def clip(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut noted (a failing assert can print megabytes)."""
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit:,} characters cut]"


def make_report(framework: str, shown: str, target: str | None, result: ExecResult) -> TestReport:
    return TestReport(
        framework=framework,
        command=shown,
        target=target,
        exit_code=result.exit_code,
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        output=result.output,
    )


#: How much of a run's output a problem with no results quotes (its last lines: where tools say why).
PROBLEM_OUTPUT_LINES = 15


def no_results(result: ExecResult, what: str) -> str:
    """Why a run has no results, with the end of its output (the cause is there, e.g. an import
    error before any test, or a missing plugin)."""
    if result.timed_out:
        return f"{what}: the run timed out."
    lines = [line for line in result.output.strip().splitlines() if line.strip()][-PROBLEM_OUTPUT_LINES:]
    if not lines:
        return f"{what}; it printed nothing."
    return f"{what}; its output ends with:\n" + "\n".join(f"  {line}" for line in lines)


async def run_command(
    sandbox: Sandbox,
    framework: str,
    args: list[str],
    shown_target: str | None,
    timeout: float,
    on_output: OutputSink | None = None,
) -> tuple[TestReport, ExecResult]:
    """Run ``args`` (an argument list, quoted here) in the workspace; the report to fill in and
    the raw result (``on_output``: its output as it comes, see :meth:`Sandbox.exec`)."""
    command = shlex.join(args)
    result = await sandbox.exec(command, timeout=timeout, cwd=WORKSPACE, on_output=on_output)
    return make_report(framework, command, shown_target, result), result
