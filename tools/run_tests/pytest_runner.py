"""pytest: results from the JUnit XML file pytest writes into a private temporary folder of the
sandbox (``--junitxml``; the folder is removed after every run), never from its console output."""

from __future__ import annotations

import posixpath
import secrets
import shlex
import xml.etree.ElementTree as ET

from clover_agent.sandboxes.base import WORKSPACE, OutputSink, Sandbox
from clover_agent.sandboxes.tempdir import private_temp_dir
from clover_agent.tools.run_tests import guarded as guard
from clover_agent.tools.run_tests import per_test_timeout
from clover_agent.tools.run_tests.detect import FIND_PYTHON
from clover_agent.tools.run_tests.report import (
    TestFailure,
    TestReport,
    make_report,
    no_results,
    trim_traceback,
)
from clover_agent.tools.run_tests.targets import Target

#: Starts pytest as ``python -m pytest`` would (the workspace on ``sys.path`` by its absolute path,
#: so a test that changes folder still imports from it), with the private folder (argument 1) first.
_UNGUARDED_LAUNCHER = (
    "import os, sys; private = sys.argv.pop(1); sys.path[:1] = [os.getcwd()] if sys.path[:1] == [''] "
    "else sys.path[:1]; sys.path.insert(0, private); import pytest; sys.argv[0] = 'pytest'; "
    "sys.exit(pytest.main(sys.argv[1:]))"
)

#: The largest JUnit XML report read back (a suite of tens of thousands of tests fits).
MAX_REPORT_BYTES = 32 * 1024 * 1024


def _looks_like_path(word: str) -> bool:
    return "::" in word or word.endswith(".py") or "/" in word


def pytest_args(target: Target | None, existing: bool) -> list[str]:
    """Command-line selection for ``target``: a ``-k`` expression, node ids or paths (several may be
    given; always after ``--``, so none can be an option), or all. A bare word that is no existing
    path is a ``-k`` expression."""
    if target is None:
        return []
    if target.expression is not None:
        return ["-k", target.expression]
    if existing or all(_looks_like_path(w) for w in target.words):
        return ["--", *target.words]
    return ["-k", " ".join(target.words)]


def _node_id(case: ET.Element) -> str:
    for prop in case.iterfind("properties/property"):
        if prop.get("name") == per_test_timeout.NODE_ID_PROPERTY and prop.get("value"):
            return str(prop.get("value"))
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


async def run_pytest(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    *,
    workers: int = 1,
    guarded: bool = False,
    on_output: OutputSink | None = None,
    test_timeout: float | None = None,
) -> TestReport:
    """Run pytest on ``target`` in ``sandbox``; the report of its outcomes.

    - ``workers`` > 1: that many processes where the sandbox's Python has pytest-xdist (else serially).
    - ``guarded``: started so that the workspace cannot shadow pytest or its plugins.
    - ``on_output``: the run's output as it comes (not for a guarded run).
    - ``test_timeout``: seconds each test may take before it fails alone (None: a fifth of ``timeout``).

    A guarded run is also cross-checked with a live result stream
    (:mod:`~clover_agent.tools.run_tests.guarded`). Workers fall back to one process also when the
    project's configuration refuses ``-n``. Per-test limits: :mod:`.per_test_timeout`.
    """
    limit = per_test_timeout.default_limit(timeout) if test_timeout is None else test_timeout
    if workers > 1:
        report = await _run_pytest(sandbox, target, shown_target, timeout, workers, guarded, on_output, limit)
        if not (report.total == 0 and report.exit_code == 4):  # 4: pytest refused the options
            return report
    return await _run_pytest(sandbox, target, shown_target, timeout, 1, guarded, on_output, limit)


#: pytest's deprecation notices (``PytestRemovedIn9Warning``, ``In10``, ...: pytest's own future,
#: not the project's behaviour) are ignored in every run: a project whose configuration says
#: ``filterwarnings = error`` was written for the pytest of its time, and under a current pytest
#: its collection would fail on them (python-dateutil 2.9.0's parametrize with a generator).
#: The command-line filter comes after the configuration's, so it wins for that category only.
PYTEST_OWN_NOTICES = ("-W", "ignore::pytest.PytestDeprecationWarning")


async def _run_pytest(
    sandbox: Sandbox,
    target: Target | None,
    shown_target: str | None,
    timeout: float,
    workers: int,
    guarded: bool,
    on_output: OutputSink | None,
    test_timeout: float,
) -> TestReport:
    existing = (
        target is not None
        and len(target.words) == 1
        and await sandbox.stat(posixpath.join(WORKSPACE, target.words[0].split("::")[0])) is not None
    )
    args = pytest_args(target, existing)
    shown = shlex.join(["python", "-m", "pytest", *args])
    async with private_temp_dir(sandbox) as folder:
        xml_path = f"{folder}/junit.xml"
        # -n only where pytest-xdist is installed; the JUnit XML report is the same either way.
        parallel = (
            f'__par=; "$__py" -c "import xdist" >/dev/null 2>&1 && __par="-n {int(workers)}"; '
            if workers > 1
            else "__par=; "
        )
        # pytest's notices about its own future (a project written for an older pytest, whose
        # configuration turns warnings into errors, would fail to collect under a current one).
        options = ["-p", "no:cacheprovider", "-o", "junit_family=xunit1", "--tb=short", *PYTEST_OWN_NOTICES]
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        limiter = per_test_timeout.plugin_module()
        await sandbox.write_file(
            f"{folder}/{limiter}.py", per_test_timeout.plugin_source(test_timeout).encode()
        )
        options += ["-p", limiter]
        if guarded:
            key = guard.new_key()
            key_file = f"{folder}/{secrets.token_hex(8)}"
            await sandbox.write_file(key_file, key.encode("ascii"))
            options.append("--confcutdir=.")
            start = guard.launch_command('"$__py"', folder, key_file, options)
            find = guard.FIND_PYTHON_GUARDED
        else:
            # The private folder first on sys.path (before the workspace), for the plugin alone.
            start = '"$__py" -c ' + shlex.join([_UNGUARDED_LAUNCHER, folder, *options])
            find = FIND_PYTHON
        command = (
            f"{find}; "
            '[ -n "$__py" ] || { echo "pytest is not installed in the sandbox"; exit 127; }; '
            + parallel
            + start
            + " $__par "
            + shlex.join(["--continue-on-collection-errors", f"--junitxml={xml_path}", *args])
        )
        result = await sandbox.exec(
            command, timeout=timeout, cwd=WORKSPACE, env=env, on_output=None if guarded else on_output
        )  # guarded: its own stream in the output
        report = make_report("pytest", shown, shown_target, result)
        try:
            xml_text = (await sandbox.read_file(xml_path, max_bytes=MAX_REPORT_BYTES)).decode(
                "utf-8", "replace"
            )
        except FileNotFoundError:
            report.problem = no_results(result, "pytest wrote no JUnit XML report")
            return report
        except OSError as exc:  # replaced by a FIFO, grown past the limit, ...
            report.problem = f"pytest's JUnit XML report could not be read: {exc.strerror or exc}"
            return report
    try:
        parse_junit_xml(xml_text, report)
    except ET.ParseError as exc:
        report.problem = f"pytest's JUnit XML report could not be read: {exc}"
        return report
    if guarded:
        stream = guard.read_stream(result.output, key)
        guard.cross_check(report, stream.outcomes())
        report.integrity += stream.problems
        if not stream.finished and not result.timed_out:
            report.integrity.append(
                "the run ended before pytest finished its session (the process was ended from inside)"
            )
        report.output = guard.without_stream(report.output)
    report.structured = True
    if result.exit_code == 5:
        report.problem = "pytest collected no tests (exit code 5): check the target."
    elif result.exit_code not in (0, 1) and report.total == 0:
        # pytest's own complaint (a node id not found, a bad option) is the useful part.
        said = [line for line in result.output.splitlines() if line.startswith("ERROR: ")][:3]
        why = f" ({'; '.join(said)})" if said else ""
        report.problem = no_results(result, f"pytest stopped with exit code {result.exit_code}{why}")
    return report
