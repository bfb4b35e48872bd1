"""A guarded pytest run, for the runs that judge a patch (``fix``'s held-out runs).

The workspace cannot shadow pytest or its plugins (a launcher moves workspace folders to the end of
``sys.path``, turns plugin autoloading off and names the environment's own plugins). Results are
read from the JUnit XML report and from a results channel the code under test cannot forge by name
or by reading globals: a plugin object (no module), a per-run key read from a file removed before
any workspace code runs and kept only in a closure, each record numbered and signed. A test counts
as passed only where both say so; anything wrong with the channel goes to the report's
``integrity`` (docs/tools.md, "run_tests"; docs/verdict-checks.md for what it cannot stop).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import shlex
from dataclasses import dataclass, field

from clover_agent.tools.run_tests.report import TestFailure, TestReport

#: The results channel's writer, shared by the launcher and the independent runner
#: (:mod:`.independent`). ``_channel(KEY_FILE)`` reads the run's key from a file in the private
#: folder and removes it before any workspace code runs, keeps it only in the closure of the
#: ``send`` it returns (no module global, no name, no environment variable holds it), and writes each
#: record to a duplicate of fd 1 taken at that moment, with a sequence number and a keyed digest made
#: with functions taken before the workspace's code could replace them. A record is plain text:
#: ``SEQ EVENT OUTCOME XFAIL ID-HEX``.
CHANNEL_SOURCE = """
def _channel(key_file):
    import hashlib, os
    with open(key_file, "rb") as handle:
        key = handle.read()
    os.unlink(key_file)
    out, write, sha = os.dup(1), os.write, hashlib.sha256
    state = [0, True]
    def send(event, outcome="-", xfail=False, test_id=""):
        if not state[1]:
            return
        body = "%d %s %s %d %s" % (state[0], event, outcome, 1 if xfail else 0,
                                   str(test_id).encode("utf-8", "surrogateescape").hex())
        state[0] += 1
        data = body.encode("ascii", "backslashreplace")
        mac = sha(key + sha(key + data).digest()).hexdigest()
        try:
            write(out, b"\\n\\x1eclover-live " + mac.encode("ascii") + b" " + data + b"\\n")
        except OSError:
            pass
    def off():
        state[1] = False
    return send, off
"""

#: The launcher, run as ``python -c LAUNCHER PRIVATE_DIR KEY_FILE PYTEST_ARGS...`` in the workspace:
#: the workspace cannot shadow pytest or its plugins, and the live result stream is a plugin object
#: made here (``pytest.main(plugins=...)``), not a module anything can find by name.
LAUNCHER = (
    CHANNEL_SOURCE
    + """
def _launch():
    import os, sys
    private, key_file = sys.argv.pop(1), sys.argv.pop(1)
    send, off = _channel(key_file)
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

    class Stream:
        def pytest_configure(self, config):
            if hasattr(config, "workerinput"):
                off()

        def pytest_sessionstart(self, session):
            send("start")

        def pytest_runtest_logreport(self, report):
            when = "subtest" if "ubtest" in type(report).__name__ else report.when
            send(when, report.outcome, hasattr(report, "wasxfail"), report.nodeid)

        def pytest_collectreport(self, report):
            if report.failed:
                send("collect", "failed", False, report.nodeid)

        def pytest_sessionfinish(self, session, exitstatus):
            send("finish", str(int(exitstatus)))

    import pytest
    named = [arg for module in plugins for arg in ("-p", module)]
    sys.argv[0] = "pytest"
    return pytest.main([*named, *sys.argv[1:]], plugins=[Stream()])


import sys
sys.exit(_launch())
"""
)

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

_LIVE = re.compile(r"\x1eclover-live ([0-9a-f]{64}) ([^\n]*)")
_LIVE_LINE = re.compile(r"\n?\x1eclover-live [^\n]*\n?")
_BODY = re.compile(r"(\d+) (\S+) (\S+) ([01]) ([0-9a-f]*)")


#: :data:`~clover_agent.tools.run_tests.detect.FIND_PYTHON`, but the probe imports no workspace module.
FIND_PYTHON_GUARDED = (
    'for __py in python3 python; do if command -v "$__py" >/dev/null 2>&1 && '
    '"$__py" -c "import sys; sys.path.pop(0); import pytest" >/dev/null 2>&1; then break; fi; __py=; done'
)


def new_key() -> str:
    """A run's key for the results channel (written to a file the launcher reads and removes)."""
    return secrets.token_hex(32)


def launch_command(python: str, private_dir: str, key_file: str, args: list[str]) -> str:
    """The shell words that start pytest guarded (``python`` is a shell expression, e.g. ``"$__py"``)."""
    return f"{python} -c {shlex.quote(LAUNCHER)} " + shlex.join([private_dir, key_file, *args])


def _mac(key: str, body: str) -> str:
    secret, data = key.encode("ascii"), body.encode("ascii", "backslashreplace")
    return hashlib.sha256(secret + hashlib.sha256(secret + data).digest()).hexdigest()


@dataclass
class Stream:
    """What a run's results channel said: each test's phases, and why it cannot be trusted
    (``problems``: forged, repeated, missing or conflicting records); ``finished``: the runner's
    own end-of-session record came."""

    phases: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    finished: bool = False

    def outcomes(self) -> dict[str, str]:
        """Each test's outcome as JUnit would name it: passed, failed, error, skipped."""
        outcomes = {}
        for test_id, seen in self.phases.items():
            call = seen.get("call")
            if (call is not None and call[0] == "failed") or seen.get("subtest", ("", False))[0] == "failed":
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


def read_stream(output: str, key: str) -> Stream:
    """The records in ``output`` that ``key`` signed, in order from the session's start: a record
    not signed with the key is forged (counted, never read); one out of sequence (repeated or after
    a gap) or a second result for a test's phase (a runner reports each once; a rerun plugin's
    ``rerun`` and subtests aside) makes the run untrusted, and the test's outcome an error."""
    stream = Stream()
    forged, expected, conflicts = 0, 0, []
    for match in _LIVE.finditer(output):
        mac, body = match.group(1), match.group(2)
        parsed = _BODY.fullmatch(body)
        if parsed is None or not hmac.compare_digest(mac, _mac(key, body)):
            forged += 1
            continue
        seq, event, outcome, xfail = int(parsed.group(1)), parsed.group(2), parsed.group(3), parsed.group(4)
        if seq < expected:
            stream.problems.append(f"the runner's result record {seq} came again (a replayed record)")
            continue
        if seq > expected:
            stream.problems.append(
                f"{seq - expected} of the runner's result records are missing before record {seq}"
            )
        expected = seq + 1
        if seq == 0 and event != "start":
            stream.problems.append("the runner's result records do not begin with the session's start")
        if event in ("start", "finish"):
            stream.finished = stream.finished or event == "finish"
            continue
        try:
            test_id = bytes.fromhex(parsed.group(5)).decode("utf-8", "surrogateescape")
        except ValueError:
            forged += 1
            continue
        if outcome == "rerun":
            continue
        seen = stream.phases.setdefault(test_id, {})
        if event == "subtest":
            if outcome == "failed" or event not in seen:
                seen[event] = (outcome, xfail == "1")
            continue
        if event in seen:
            conflicts.append(test_id)
            seen["conflict"] = ("failed", False)
            continue
        seen[event] = (outcome, xfail == "1")
    if forged:
        stream.problems.append(
            f"{forged} result record(s) were not written by the runner (the run's key does not sign them)"
        )
    if conflicts:
        shown = ", ".join(sorted(set(conflicts))[:5])
        stream.problems.append(f"two results were reported for one phase of: {shown}")
    return stream


def live_outcomes(output: str, key: str) -> dict[str, str]:
    """Each test's outcome from the results channel in ``output`` (:func:`read_stream`)."""
    return read_stream(output, key).outcomes()


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
