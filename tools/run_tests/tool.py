"""The ``run_tests`` tool and :func:`run_tests_in`, the entry point other code uses."""

from __future__ import annotations

from typing import Any, ClassVar

from clover_agent.sandboxes.base import OutputSink, Sandbox
from clover_agent.tools.base import Tool, ToolContext, ToolResult
from clover_agent.tools.run_tests.cargo_runner import run_cargo
from clover_agent.tools.run_tests.detect import detect_framework
from clover_agent.tools.run_tests.go_runner import run_go
from clover_agent.tools.run_tests.npm_runner import run_npm
from clover_agent.tools.run_tests.pytest_runner import run_pytest
from clover_agent.tools.run_tests.report import TestReport
from clover_agent.tools.run_tests.targets import parse_target
from clover_agent.tools.run_tests.unittest_runner import run_unittest

DEFAULT_TIMEOUT_S = 600.0

RUNNERS = {
    "pytest": run_pytest,
    "unittest": run_unittest,
    "npm": run_npm,
    "go": run_go,
    "cargo": run_cargo,
}


async def run_tests_in(
    sandbox: Sandbox,
    target: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    framework: str | None = None,
    workers: int = 1,
    guarded: bool = False,
    on_output: OutputSink | None = None,
    test_timeout: float | None = None,
) -> TestReport:
    """Detect the framework (unless given) and run ``target`` (all tests when None); the entry point
    other code uses to run tests.

    - ``workers`` > 1: pytest in that many processes where the project has pytest-xdist.
    - ``guarded``: pytest started so that the workspace cannot shadow it or its plugins (:mod:`.guarded`).
    - ``on_output``: the run's output as it comes (:meth:`Sandbox.exec`).
    - ``test_timeout``: seconds each pytest test may take (None: a fifth of ``timeout``).

    A pytest test past ``test_timeout`` fails alone (:mod:`.per_test_timeout`). Other frameworks than
    pytest run as usual, unguarded.

    Raises :class:`~clover_agent.tools.base.ToolError` for a target that could become an option or
    leaves the workspace (see :mod:`~clover_agent.tools.run_tests.targets`), before anything runs.
    """
    checked = parse_target(target)
    framework = framework or await detect_framework(sandbox)
    runner = RUNNERS.get(framework)
    if runner is None:
        return TestReport(
            framework="none",
            command="",
            target=target,
            exit_code=None,
            problem="No test framework found in /workspace (looked for pytest/unittest files, a package.json "
            "test script, go.mod and Cargo.toml). Run the tests with the shell tool instead.",
        )
    if runner is run_pytest:
        return await run_pytest(
            sandbox,
            checked,
            target,
            timeout,
            workers=workers,
            guarded=guarded,
            on_output=on_output,
            test_timeout=test_timeout,
        )
    return await runner(sandbox, checked, target, timeout, on_output=on_output)


class RunTestsTool(Tool):
    name = "run_tests"
    description = (
        "Run the project's tests (pytest, unittest, npm, go or cargo, detected from the workspace) and report "
        "passed / failed / errors / skipped with the failing tests' messages and tracebacks. `target` "
        "selects tests: pytest node ids (`tests/test_x.py::test_y`), files or directories separated by spaces, "
        "or `-k EXPRESSION`; omit it to run everything. Other options are not accepted: use the shell for those."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "target": {
                "type": "string",
                "description": "Node id, file, directory or `-k EXPRESSION`; omit to run all tests.",
            },
        },
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        target = (args.get("target") or "").strip() or None
        report = await run_tests_in(ctx.sandbox, target, on_output=ctx.on_output)
        return ToolResult(report.all_passed, report.summary(), {"report": report.to_dict()})
