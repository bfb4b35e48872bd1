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

Other code (the ``fix`` command) uses :func:`run_tests_in` directly::

    report = await run_tests_in(sandbox, "tests/test_x.py::test_y")
    if report.all_passed: ...
"""

from __future__ import annotations

import configparser
import json
import posixpath
import re
import shlex
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from clover_agent.sandboxes.base import WORKSPACE, ExecResult, Sandbox
from clover_agent.sandboxes.tempdir import private_temp_dir
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult, head_tail

DEFAULT_TIMEOUT_S = 600.0
TRACEBACK_MAX_LINES = 30
TRACEBACK_MAX_CHARS = 3000
FAILURES_SHOWN = 10
_PYTHON_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
# Pick the first Python that has pytest (or, for unittest, the first Python at all).
_FIND_PYTHON = (
    'for __py in python3 python; do if command -v "$__py" >/dev/null 2>&1 && '
    '"$__py" -c "import pytest" >/dev/null 2>&1; then break; fi; __py=; done'
)


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
            lines.append(f"\n{failure.kind.upper()}: {failure.test_id}\n  {failure.message}")
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


# --- detection -------------------------------------------------------------------------------


async def _read_text(sandbox: Sandbox, rel: str) -> str | None:
    try:
        return (await sandbox.read_file(f"{WORKSPACE}/{rel}")).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _has_pytest_config(name: str, text: str) -> bool:
    if name in ("pytest.ini", "conftest.py"):
        return True
    if name == "pyproject.toml":
        try:
            return "pytest" in tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return "[tool.pytest" in text
    section = {"setup.cfg": "tool:pytest", "tox.ini": "pytest"}[name]
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return f"[{section}]" in text
    return parser.has_section(section)


def _npm_test_script(text: str) -> str | None:
    try:
        script = json.loads(text).get("scripts", {}).get("test")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(script, str) or "no test specified" in script:
        return None
    return script


async def detect_framework(sandbox: Sandbox) -> str:
    """The test framework of the workspace (see the module docstring), or "none"."""
    entries = await sandbox.list_files(WORKSPACE, max_depth=3)
    rels = {e.path[len(WORKSPACE) + 1 :] for e in entries if not e.is_dir}
    for name in ("pytest.ini", "conftest.py", "pyproject.toml", "setup.cfg", "tox.ini"):
        if name in rels:
            text = await _read_text(sandbox, name)
            if text is not None and _has_pytest_config(name, text):
                return "pytest"
    if any(_PYTHON_TEST_FILE.search(rel) and not rel.startswith(".") for rel in rels):
        probe = await sandbox.exec(f'{_FIND_PYTHON}; [ -n "$__py" ]', timeout=60, cwd=WORKSPACE)
        return "pytest" if probe.exit_code == 0 else "unittest"
    if "package.json" in rels:
        text = await _read_text(sandbox, "package.json")
        if text is not None and _npm_test_script(text):
            return "npm"
    if "go.mod" in rels:
        return "go"
    if "Cargo.toml" in rels:
        return "cargo"
    return "none"


# --- pytest ----------------------------------------------------------------------------------


def _looks_like_path(word: str) -> bool:
    return "::" in word or word.endswith(".py") or "/" in word


def pytest_args(target: str | None, existing: bool) -> list[str]:
    """Command-line selection for ``target``: a ``-k`` expression, node ids or paths (several may be
    given, separated by spaces), or all. A bare word that is no existing path is a ``-k`` expression."""
    if not target:
        return []
    if target.startswith("-k "):
        return ["-k", target[3:].strip()]
    if existing:
        return [target]
    words = target.split()
    if all(_looks_like_path(w) for w in words):
        return words
    return ["-k", target]


def _node_id(case: ET.Element) -> str:
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if not file:
        return f"{classname}::{name}" if classname else name
    module = file[: -len(".py")].replace("/", ".") if file.endswith(".py") else file
    parts = [file]
    if classname.startswith(module + "."):
        parts += classname[len(module) + 1 :].split(".")
    parts.append(name)
    return "::".join(parts)


def parse_junit_xml(xml_text: str, report: TestReport) -> None:
    """Fill ``report`` from pytest's JUnit XML (``junit_family=xunit1``, which has ``file``)."""
    root = ET.fromstring(xml_text)
    for case in root.iter("testcase"):
        test_id = _node_id(case)
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None or error is not None:
            kind = "failed" if failure is not None else "error"
            for element, element_kind in ((failure, "failed"), (error, "error")):
                if element is None:
                    continue
                if element_kind == "failed":
                    report.failed += 1
                else:
                    report.errors += 1
                report.failures.append(
                    TestFailure(
                        test_id,
                        element_kind,
                        (element.get("message") or "").strip(),
                        trim_traceback(element.text or ""),
                    )
                )
            report.outcomes[test_id] = kind
        elif skipped is not None:
            report.skipped += 1
            report.outcomes[test_id] = "skipped"
        else:
            report.passed += 1
            report.outcomes[test_id] = "passed"


async def _run_pytest(sandbox: Sandbox, target: str | None, timeout: float) -> TestReport:
    single = bool(target) and len(target.split()) == 1
    existing = single and await sandbox.stat(posixpath.join(WORKSPACE, target.split("::")[0])) is not None
    args = pytest_args(target, existing)
    shown = shlex.join(["python", "-m", "pytest", *args])
    async with private_temp_dir(sandbox) as folder:
        xml_path = f"{folder}/junit.xml"
        command = (
            f"{_FIND_PYTHON}; "
            '[ -n "$__py" ] || { echo "pytest is not installed in the sandbox"; exit 127; }; '
            + '"$__py" '
            + shlex.join(
                [
                    *("-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_family=xunit1", "--tb=short"),
                    "--continue-on-collection-errors",
                    f"--junitxml={xml_path}",
                    *args,
                ]
            )
        )
        result = await sandbox.exec(
            command, timeout=timeout, cwd=WORKSPACE, env={"PYTHONDONTWRITEBYTECODE": "1"}
        )
        report = _report("pytest", shown, target, result)
        try:
            xml_text = (await sandbox.read_file(xml_path)).decode("utf-8", "replace")
        except FileNotFoundError:
            report.problem = _no_results(result, "pytest wrote no JUnit XML report")
            return report
    try:
        parse_junit_xml(xml_text, report)
    except ET.ParseError as exc:
        report.problem = f"pytest's JUnit XML report could not be read: {exc}"
        return report
    report.structured = True
    if result.exit_code == 5:
        report.problem = "pytest collected no tests (exit code 5): check the target."
    elif result.exit_code not in (0, 1) and report.total == 0:
        # pytest's own complaint (a node id not found, a bad option) is the useful part.
        said = [line for line in result.output.splitlines() if line.startswith("ERROR: ")][:3]
        why = f" ({'; '.join(said)})" if said else ""
        report.problem = _no_results(result, f"pytest stopped with exit code {result.exit_code}{why}")
    return report


def _report(framework: str, shown: str, target: str | None, result: ExecResult) -> TestReport:
    return TestReport(
        framework=framework,
        command=shown,
        target=target,
        exit_code=result.exit_code,
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        output=result.output,
    )


def _no_results(result: ExecResult, what: str) -> str:
    if result.timed_out:
        return f"{what}: the run timed out."
    return f"{what}; see the output."


# --- unittest --------------------------------------------------------------------------------

_UNITTEST_LINE = re.compile(
    r"^(?P<name>\S+) \((?P<where>[^)]*)\)(?:\n.*?)?? \.\.\. (?P<status>ok|FAIL|ERROR|skipped.*|expected failure|unexpected success)$",
    re.MULTILINE,
)
_UNITTEST_SECTION = re.compile(
    r"^={20,}\n(?P<kind>FAIL|ERROR): (?P<name>\S+) \((?P<where>[^)]*)\)\n(?:.*\n)*?-{20,}\n(?P<body>.*?)(?=^={20,}\n|^-{20,}\nRan )",
    re.MULTILINE | re.DOTALL,
)


def unittest_target(target: str | None) -> list[str]:
    """``unittest`` arguments (verbose): discovery, ``-k``, or a dotted name from a path or node id.

    ``discover`` must come first: unittest only recognises it as the first argument.
    """
    if not target:
        return ["discover", "-v"]
    if target.startswith("-k "):
        return ["discover", "-v", "-k", target[3:].strip()]
    path, _, rest = target.partition("::")
    if path.endswith(".py"):
        path = path[: -len(".py")].replace("/", ".")
    dotted = ".".join([path, *[p for p in rest.split("::") if p]])
    return ["-v", dotted]


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


async def _run_unittest(sandbox: Sandbox, target: str | None, timeout: float) -> TestReport:
    args = ["-m", "unittest", *unittest_target(target)]
    command = 'py=$(command -v python3 || command -v python) && "$py" ' + shlex.join(args)
    result = await sandbox.exec(command, timeout=timeout, cwd=WORKSPACE, env={"PYTHONDONTWRITEBYTECODE": "1"})
    report = _report("unittest", shlex.join(["python", *args]), target, result)
    parse_unittest_output(result.output, report)
    if report.total == 0:
        report.problem = _no_results(result, "no unittest results were found in the output")
    return report


# --- npm, go, cargo --------------------------------------------------------------------------


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


async def _run_npm(sandbox: Sandbox, target: str | None, timeout: float) -> TestReport:
    args = ["npm", "test", "--silent"] + (["--", target] if target else [])
    result = await sandbox.exec(shlex.join(args), timeout=timeout, cwd=WORKSPACE)
    report = _report("npm", shlex.join(args), target, result)
    if not parse_tap_output(result.output, report):
        report.problem = (
            f"`npm test` exited with code {result.exit_code}; its output has no TAP summary, so no counts "
            "are available."
        )
    return report


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


async def _run_go(sandbox: Sandbox, target: str | None, timeout: float) -> TestReport:
    if target and target.startswith("-k "):
        args = ["go", "test", "-json", "-run", target[3:].strip(), "./..."]
    elif target and (target.startswith(".") or "/" in target):
        args = ["go", "test", "-json", target]
    elif target:
        args = ["go", "test", "-json", "-run", target, "./..."]
    else:
        args = ["go", "test", "-json", "./..."]
    result = await sandbox.exec(shlex.join(args), timeout=timeout, cwd=WORKSPACE)
    report = _report("go", shlex.join(args), target, result)
    parse_go_json(result.output, report)
    report.structured = True
    if report.total == 0:
        report.problem = _no_results(result, "`go test -json` reported no tests")
    return report


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


async def _run_cargo(sandbox: Sandbox, target: str | None, timeout: float) -> TestReport:
    name = target[3:].strip() if target and target.startswith("-k ") else target
    args = ["cargo", "test", "--offline", *([name] if name else [])]
    result = await sandbox.exec(shlex.join(args), timeout=timeout, cwd=WORKSPACE)
    report = _report("cargo", shlex.join(args), target, result)
    parse_cargo_output(result.output, report)
    if report.total == 0:
        report.problem = _no_results(result, "no `cargo test` results were found in the output")
    return report


RUNNERS = {
    "pytest": _run_pytest,
    "unittest": _run_unittest,
    "npm": _run_npm,
    "go": _run_go,
    "cargo": _run_cargo,
}


async def run_tests_in(
    sandbox: Sandbox,
    target: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    framework: str | None = None,
) -> TestReport:
    """Detect the framework (unless given) and run ``target`` (all tests when None)."""
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
    return await runner(sandbox, target, timeout)


class RunTestsTool(Tool):
    name = "run_tests"
    description = (
        "Run the project's tests (pytest, unittest, npm, go or cargo, detected from the workspace) and report "
        "passed / failed / errors / skipped with the failing tests' messages and tracebacks. `target` "
        "selects tests: a pytest node id (`tests/test_x.py::test_y`), a file or directory, or `-k EXPRESSION`; "
        "omit it to run everything."
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
        if target and target.startswith("/"):
            if not (target == WORKSPACE or target.startswith(WORKSPACE + "/")):
                raise ToolError(
                    f"The target {target} is outside the workspace; give a path inside {WORKSPACE}."
                )
            target = target[len(WORKSPACE) + 1 :] or None
        if target and ".." in target.split("::")[0].split("/"):
            raise ToolError(f"The target {target} climbs out of the workspace through `..`.")
        report = await run_tests_in(ctx.sandbox, target)
        return ToolResult(report.all_passed, report.summary(), {"report": report.to_dict()})
