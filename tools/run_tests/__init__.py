"""``run_tests``: run the project's tests in the sandbox and report them as a :class:`TestReport`.

The framework is found from the workspace's files, in this order:

1. ``pytest``: ``pytest.ini``, ``conftest.py``, ``[tool.pytest...]`` in ``pyproject.toml``,
   ``[tool:pytest]`` in ``setup.cfg`` or ``[pytest]`` in ``tox.ini`` — or Python test files
   (``test_*.py``, ``*_test.py``) when pytest is installed in the sandbox. Results come from the
   JUnit XML file pytest writes into a private temporary folder of the sandbox (``--junitxml``;
   the folder is removed after every run), never from its console output.
2. ``unittest``: Python test files without pytest. Best effort: ``python -m unittest -v`` output
   is parsed (per-test ``... ok|FAIL|ERROR|skipped`` lines and the failure sections).
3. ``npm``: a ``test`` script in ``package.json``. Best effort: TAP summary lines (``# pass N``,
   ``# fail N``, as ``node --test`` prints them) when present, else only the exit code.
4. ``go``: ``go.mod``. ``go test -json``: one JSON event per line, so per-test outcomes are exact.
5. ``cargo``: ``Cargo.toml``. Best effort: ``test NAME ... ok|FAILED|ignored`` lines.

``TestReport.structured`` says whether the counts come from a machine-readable report (pytest's
JUnit XML, ``go test -json``) or from parsed console output.

Targets are checked first (:mod:`.targets`): none can become an option of the framework.

One module per framework (``pytest_runner``, ``unittest_runner``, ``npm_runner``, ``go_runner``,
``cargo_runner``), the report (``report``), detection (``detect``) and the tool (``tool``).

Other code (the ``fix`` command) uses :func:`run_tests_in` directly::

    report = await run_tests_in(sandbox, "tests/test_x.py::test_y")
    if report.all_passed: ...
"""

from __future__ import annotations

from clover_agent.tools.run_tests.cargo_runner import cargo_command, parse_cargo_output
from clover_agent.tools.run_tests.detect import detect_framework
from clover_agent.tools.run_tests.go_runner import go_command, parse_go_json
from clover_agent.tools.run_tests.npm_runner import npm_command, parse_tap_output
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
