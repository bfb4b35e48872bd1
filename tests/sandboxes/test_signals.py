"""Our SIGINT/SIGTERM cleanup handler keeps the process's previous disposition: an ignored signal
stays ignored (the sandboxes stay up and the process carries on), a default one still ends the
process with that signal, and a Python handler still runs after the sandboxes are closed. Each case
drives a real child process holding a real local sandbox."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from .conftest import start_holder


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.usefixtures("own_leftovers")
def test_an_ignored_signal_stays_ignored(repo: Path, signum: signal.Signals) -> None:
    child, ident = start_holder("local", repo, f"ignore-{signum.name}")
    host = Path(ident)
    other = signal.SIGTERM if signum == signal.SIGINT else signal.SIGINT
    assert child.stdin is not None and child.stdout is not None
    try:
        child.send_signal(signum)
        # Answered after the signal was handled (or ignored): no fixed wait, whatever the load.
        child.stdin.write("ping\n")
        child.stdin.flush()
        answer = child.stdout.readline()
        assert answer, "an ignored signal ended the process"
        assert json.loads(answer) == {"alive": True, "sandbox": True}, "an ignored signal closed the sandbox"
        child.send_signal(other)  # still ours: it closes the sandbox and ends the process
        assert child.wait(timeout=120) == -other
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=120)
    assert not host.exists()


@pytest.mark.usefixtures("own_leftovers")
def test_default_sigterm_still_terminates_with_its_status(repo: Path) -> None:
    child, ident = start_holder("local", repo)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=120) == -signal.SIGTERM
    assert not Path(ident).exists()


@pytest.mark.usefixtures("own_leftovers")
def test_a_previous_python_handler_still_runs_after_cleanup(repo: Path) -> None:
    child, ident = start_holder("local", repo, "handle-SIGTERM")
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=120) == 3
    assert child.stdout is not None and "previous handler ran" in child.stdout.read()
    assert not Path(ident).exists()
