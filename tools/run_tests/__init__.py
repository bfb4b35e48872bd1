"""``run_tests``: run the project's tests in the sandbox and report them as a :class:`TestReport`.

The framework is found from the workspace's files (:mod:`.detect`: pytest, unittest, npm, go,
cargo, in that order; docs/tools.md says from what and how exact each report is), targets are
checked first (:mod:`.targets`: none can become an option of the framework), and one module per
framework runs it (``pytest_runner``, ``unittest_runner``, ``npm_runner``, ``go_runner``,
``cargo_runner``) into the report (``report``); ``tool`` is the tool. Other code (the ``fix``
command) uses :func:`run_tests_in` directly::

    report = await run_tests_in(sandbox, "tests/test_x.py::test_y")
    if report.all_passed: ...
"""

from __future__ import annotations

from clover_agent.tools.run_tests.cargo_runner import cargo_command, parse_cargo_output
from clover_agent.tools.run_tests.detect import detect_framework
from clover_agent.tools.run_tests.go_runner import go_command, parse_go_json
from clover_agent.tools.run_tests.npm_runner import npm_command, parse_tap_output
from clover_agent.tools.run_tests.per_test_timeout import default_limit as default_test_timeout
from clover_agent.tools.run_tests.pytest_runner import parse_junit_xml, pytest_args
from clover_agent.tools.run_tests.report import TestFailure, TestReport, trim_traceback
from clover_agent.tools.run_tests.targets import Target, parse_target
from clover_agent.tools.run_tests.tool import DEFAULT_TIMEOUT_S, RUNNERS, RunTestsTool, run_tests_in
from clover_agent.tools.run_tests.unittest_runner import parse_unittest_output, unittest_target

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RUNNERS",
    "RunTestsTool",
    "Target",
    "TestFailure",
    "TestReport",
    "cargo_command",
    "default_test_timeout",
    "detect_framework",
    "go_command",
    "npm_command",
    "parse_cargo_output",
    "parse_go_json",
    "parse_junit_xml",
    "parse_tap_output",
    "parse_target",
    "parse_unittest_output",
    "pytest_args",
    "run_tests_in",
    "trim_traceback",
    "unittest_target",
]
