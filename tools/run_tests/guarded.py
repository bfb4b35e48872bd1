"""A guarded pytest run, for the run that judges a patch (``fix``'s held-out run).

The workspace cannot shadow pytest or its plugins (a launcher moves workspace folders to the end of
``sys.path``, turns plugin autoloading off and names the environment's own plugins), and results
are read twice, from the JUnit XML report and from a live stream tagged with a per-run secret: a
test counts as passed only where both say so (docs/tools.md, "run_tests"). What this cannot stop
is the code under test attacking pytest from inside the same process; the ``fix`` workflow names
such changes (:mod:`clover_agent.fix.handback.heldout`).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex

from clover_agent.tools.run_tests.report import TestFailure, TestReport

#: The live plugin's module name is this plus the run's secret (no workspace file can be it).
LIVE_PLUGIN_PREFIX = "clover_live_"
NONCE_VARIABLE = "CLOVER_LIVE_NONCE"

#: The plugin that streams each report as it is made (loaded with ``-p``, from a private folder).
PLUGIN_SOURCE = f'''"""clover-agent's live result stream (see clover_agent.tools.run_tests.guarded)."""
import json
import os

_NONCE = os.environ.pop({NONCE_VARIABLE!r}, "")
_OUT = os.dup(1) if _NONCE else -1
_ACTIVE = [False]


def _send(record):
    if not _ACTIVE[0]:
        return
    line = "\\n\\x1eclover-live " + _NONCE + " " + json.dumps(record) + "\\n"
    try:
        os.write(_OUT, line.encode("utf-8", "surrogateescape"))
    except OSError:
        pass


def pytest_configure(config):
    _ACTIVE[0] = bool(_NONCE) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    _send({{"id": report.nodeid, "when": report.when, "outcome": report.outcome,
           "xfail": hasattr(report, "wasxfail")}})


def pytest_collectreport(report):
    if report.failed:
        _send({{"id": report.nodeid, "when": "collect", "outcome": "failed", "xfail": False}})
'''

#: The launcher, run as ``python -c LAUNCHER PRIVATE_DIR PLUGIN PYTEST_ARGS...`` in the workspace.
LAUNCHER = """
import os, sys
private, live = sys.argv.pop(1), sys.argv.pop(1)
here = os.path.realpath(os.getcwd())
def inside(path):
    path = os.path.realpath(path or ".")
    return path == here or path.startswith(here + os.sep)
own = [p for p in sys.path if p and inside(p)]  # e.g. an editable install's src folder
sys.path[:] = [p for p in sys.path if not inside(p)]
import importlib.metadata as metadata
plugins = []
for dist in metadata.distributions():
    where = getattr(dist, "_path", None)
    if where is not None and inside(str(where)):
        continue
    for ep in dist.entry_points:
        module = ep.value.split(":")[0].strip()
        if ep.group == "pytest11" and module and module not in plugins:
            plugins.append(module)
sys.path.insert(0, private)
sys.path += [p for p in own if p != here] + [here]
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
import pytest
named = [arg for module in plugins for arg in ("-p", module)]
sys.argv[0] = "pytest"
sys.exit(pytest.main([*named, "-p", live, *sys.argv[1:]]))
"""

#: The installed module names (stdlib, built-in, and top-level names outside the workspace), then
#: ``pytest-plugin NAME`` for the top-level module of each of the environment's pytest plugins.
INSTALLED_NAMES = """
import os, sys
here = os.path.realpath(os.getcwd())
def inside(path):
    path = os.path.realpath(path or ".")
    return path == here or path.startswith(here + os.sep)
sys.path[:] = paths = [p for p in sys.path if not inside(p)]
import pkgutil
names = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))
names |= {m.name for m in pkgutil.iter_modules(paths)}
print("\\n".join(sorted(names)))
import importlib.metadata as metadata
for dist in metadata.distributions(path=paths):
    for ep in dist.entry_points:
        if ep.group == "pytest11":
            print("pytest-plugin", ep.value.split(":")[0].split(".")[0].strip())
"""
#: What pytest imports before any test runs (besides the environment's plugins), and what an
#: xdist worker or ``python -m unittest`` starts with (a worker puts the workspace first).
PYTEST_MODULES = frozenset(
    {
        "xdist",
        "execnet",
        "setproctitle",
        "unittest",
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "iniconfig",
        "packaging",
        "exceptiongroup",
        "tomli",
        "colorama",
        "pygments",
    }
)

_LIVE = re.compile(r"\x1eclover-live (\S+) (\{.*\})")
_LIVE_LINE = re.compile(r"\n?\x1eclover-live \S+ \{.*\}\n?")


#: :data:`~clover_agent.tools.run_tests.detect.FIND_PYTHON`, but the probe imports no workspace module.
FIND_PYTHON_GUARDED = (
    'for __py in python3 python; do if command -v "$__py" >/dev/null 2>&1 && '
    '"$__py" -c "import sys; sys.path.pop(0); import pytest" >/dev/null 2>&1; then break; fi; __py=; done'
)


def new_nonce() -> str:
    return secrets.token_hex(16)


def plugin_module(nonce: str) -> str:
    return LIVE_PLUGIN_PREFIX + nonce


def launch_command(python: str, private_dir: str, nonce: str, args: list[str]) -> str:
    """The shell words that start pytest guarded (``python`` is a shell expression, e.g. ``"$__py"``)."""
    return f"{python} -c {shlex.quote(LAUNCHER)} " + shlex.join([private_dir, plugin_module(nonce), *args])


def live_outcomes(output: str, nonce: str) -> dict[str, str]:
    """Each test's outcome from the live stream in ``output`` (only lines with ``nonce``; the
    first report of a test's phase counts), as JUnit would name it: passed, failed, error, skipped."""
    phases: dict[str, dict[str, tuple[str, bool]]] = {}
    for match in _LIVE.finditer(output):
        if match.group(1) != nonce:
            continue
        try:
            record = json.loads(match.group(2))
            test_id, when = str(record["id"]), str(record["when"])
            outcome, xfail = str(record["outcome"]), bool(record.get("xfail"))
        except (ValueError, KeyError, TypeError):
            continue
        phases.setdefault(test_id, {}).setdefault(when, (outcome, xfail))
    outcomes = {}
    for test_id, seen in phases.items():
        call = seen.get("call")
        if call is not None and call[0] == "failed":
            outcomes[test_id] = "failed"
        elif any(o == "failed" for o, _ in seen.values()):
            outcomes[test_id] = "error"
        elif any(o == "skipped" for o, _ in seen.values()):
            outcomes[test_id] = "skipped"
        elif call is not None and call[0] == "passed":
            outcomes[test_id] = "passed"
        else:
            outcomes[test_id] = "error"
    return outcomes


def without_stream(output: str) -> str:
    """``output`` without the live stream's lines (what a person reads)."""
    return _LIVE_LINE.sub("", output)


def cross_check(report: TestReport, live: dict[str, str]) -> list[str]:
    """Make ``report`` (read from JUnit XML) say no more than the live stream: a test the report
    has as passed that the stream did not see pass takes the stream's outcome (an error when the
    stream has none), and tests only the stream has are added. Returns the tests changed."""
    changed = []
    for test_id, outcome in list(report.outcomes.items()):
        seen = live.get(test_id)
        if outcome == "passed" and seen != "passed":
            report.outcomes[test_id] = seen or "error"
            what = {"failed": "failed", "error": "erred", "skipped": "was skipped"}.get(
                seen or "", "was not seen to pass"
            )
            kind = "failed" if seen == "failed" else "error"
            if seen != "skipped":
                report.failures.append(
                    TestFailure(
                        test_id, kind, f"the JUnit report says passed, but the test {what} as it ran", ""
                    )
                )
            changed.append(test_id)
    for test_id, seen in live.items():
        if test_id not in report.outcomes and not any(o.startswith(test_id + "::") for o in report.outcomes):
            report.outcomes[test_id] = seen
            if seen in ("failed", "error"):
                report.failures.append(
                    TestFailure(
                        test_id, seen, f"the test {seen} as it ran, but the JUnit report leaves it out", ""
                    )
                )
            changed.append(test_id)
    if changed:
        counted = list(report.outcomes.values())
        report.passed, report.failed = counted.count("passed"), counted.count("failed")
        report.errors, report.skipped = counted.count("error"), counted.count("skipped")
    return changed
