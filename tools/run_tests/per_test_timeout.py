"""A per-test time limit for pytest runs, so one hanging test fails alone instead of timing the
whole run out (docs/tools.md, "run_tests").

A small plugin, written into the run's private folder and loaded with ``-p``, arms a SIGALRM timer
for each test's set-up and call (and again for its teardown); when it fires, that phase fails with
"timed out after N s" and the run goes on. A test that swallows the failure still counts as failed.
It stands down where the project's own pytest-timeout sets a limit. A test blocked where signals
cannot reach it (C code that retries, its own SIGALRM handler) still runs into the run's timeout.
It also puts each test's node id in the JUnit report (a ``NODE_ID_PROPERTY`` property), so that a
test method inherited from a mixin in another file is named as pytest names it.
"""

from __future__ import annotations

import secrets

#: The plugin's module name is this plus a per-run secret (no workspace file can be it).
PLUGIN_PREFIX = "clover_timeout_"
#: The JUnit property that holds a test's node id (the report's ``file`` is where its code is).
NODE_ID_PROPERTY = "clover_node_id"
#: The per-test limit when none is given: this fraction of the whole run's time limit.
DEFAULT_FRACTION = 0.2


def default_limit(run_timeout: float) -> float:
    """The per-test limit for a run that may take ``run_timeout`` seconds."""
    return max(1.0, run_timeout * DEFAULT_FRACTION)


def plugin_module() -> str:
    return PLUGIN_PREFIX + secrets.token_hex(8)


def plugin_source(limit: float) -> str:
    """The plugin's source for a limit of ``limit`` seconds per test."""
    return PLUGIN_SOURCE.replace("LIMIT = 0.0", f"LIMIT = {float(limit)!r}", 1)


PLUGIN_SOURCE = '''"""clover-agent's per-test time limit (see clover_agent.tools.run_tests.per_test_timeout)."""
import signal
import time

import pytest

LIMIT = 0.0
_STATE = {"on": False, "item": None, "timed_out": set()}


def _message():
    return "timed out after %g s (clover-agent's per-test limit; the rest of the run went on)" % LIMIT


def _fire(signum, frame):
    item = _STATE["item"]
    if item is not None:
        _STATE["timed_out"].add(item.nodeid)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # again, should the test swallow this one
    pytest.fail(_message(), pytrace=True)


def _project_limit(config):
    """True where pytest-timeout is active and the project gives it a limit."""
    if not config.pluginmanager.hasplugin("timeout"):
        return False
    value = getattr(config.option, "timeout", None)
    if value in (None, ""):
        try:
            value = config.getini("timeout")
        except (ValueError, KeyError):
            value = None
    try:
        return float(value or 0) > 0
    except (TypeError, ValueError):
        return False


def pytest_configure(config):
    _STATE["on"] = LIMIT > 0 and hasattr(signal, "setitimer") and not _project_limit(config)


def _arm(item, seconds):
    if not _STATE["on"] or item.get_closest_marker("timeout") is not None:
        return None
    _STATE["item"] = item
    previous = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.05))
    return previous


def _disarm(previous):
    if previous is None:
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    _STATE["item"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item._clover_deadline = time.monotonic() + LIMIT
    previous = _arm(item, LIMIT)
    try:
        yield
    finally:
        _disarm(previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    deadline = getattr(item, "_clover_deadline", time.monotonic() + LIMIT)
    previous = _arm(item, deadline - time.monotonic())
    try:
        yield
    finally:
        _disarm(previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    previous = _arm(item, LIMIT)
    try:
        yield
    finally:
        _disarm(previous)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.user_properties.append(("clover_node_id", item.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.nodeid in _STATE["timed_out"] and not report.failed and call.when != "teardown":
        report.outcome = "failed"  # the test swallowed the timeout: it still did not pass
        report.longrepr = "Failed: " + _message()
        if hasattr(report, "wasxfail"):
            del report.wasxfail
'''
