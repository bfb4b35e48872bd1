"""Every way a ``fix`` run ends gives the documented exit code and one message, with the real
backends: the engine (a tiny checkpoint this test writes, on the CPU) stopped inside a model call by
its time budget (6) or by Ctrl-C (130), with no abort at the interpreter's exit, and ``summary.json``
and the trajectory's last line carrying the same code.

Each run is a separate ``python -m clover_agent`` process, as a user runs it: an abort at the
interpreter's exit ("terminate called without an active exception" from a thread still in torch)
only shows there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clover_agent.agent.trajectory import TRAJECTORY_FILE
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.errors import ExitCode
from clover_agent.fix.runs import SUMMARY_FILE
from tests.cli_process import start_signalable
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs

pytestmark = pytest.mark.slow

#: What a process must never print on its way out.
CRASHES = ("terminate called", "Traceback", "Fatal Python error", "Aborted", "core dumped")


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights, not peaked (about one token decided per pass) and a window that holds the fix
    prompt: an answer of thousands of tokens takes far longer than the budgets below."""
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("slow") / "ckpt", seed=5, overrides={"max_position_embeddings": 32768}
    )


class Output:
    """A process's stdout, read as it comes (model text streams without line ends)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.data = b""
        self._proc = proc
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := self._proc.stdout.read1(4096):  # type: ignore[union-attr]
            self.data += chunk

    def text(self) -> str:
        self._reader.join(timeout=60)
        return self.data.decode(errors="replace")


def start_fix(repo: Path, model: Path, *options: str) -> tuple[subprocess.Popen, Output]:
    proc = start_signalable(
        [sys.executable, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--backend", "engine",
         "--model", str(model), "--sandbox", "local", "--verbose", "--yes", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    return proc, Output(proc)


def recorded_codes(repo: Path) -> tuple[int, int]:
    """(summary.json's exit code, the trajectory's last line's)."""
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    last = json.loads((run / TRAJECTORY_FILE).read_text().splitlines()[-1])
    assert last["type"] == "task_finished"
    return summary["exit_code"], last["exit_code"]


def test_a_time_budget_spent_inside_a_model_call_exits_6_without_an_abort(
    tmp_path: Path, slow_model: Path
) -> None:
    repo = calculator_repo(tmp_path)
    proc, out = start_fix(repo, slow_model, "--max-time", "20")
    err = proc.communicate(timeout=900)[1].decode(errors="replace")
    text = out.text()
    assert proc.returncode == ExitCode.BUDGET_EXHAUSTED, text[-3000:] + err
    assert "time budget exhausted during a model call" in err, err
    assert not [c for c in CRASHES if c in err + text], err
    assert [line for line in err.splitlines() if line.startswith("clover-agent:")] == [
        next(line for line in err.splitlines() if line.startswith("clover-agent:"))
    ]  # one message
    assert recorded_codes(repo) == (ExitCode.BUDGET_EXHAUSTED, ExitCode.BUDGET_EXHAUSTED)
    assert "return a - b" in (repo / "calculator.py").read_text()


def test_ctrl_c_inside_a_model_call_exits_130_without_an_abort(tmp_path: Path, slow_model: Path) -> None:
    repo = calculator_repo(tmp_path)
    proc, out = start_fix(repo, slow_model, "--max-time", "900")
    deadline = time.monotonic() + 600
    # The suite's baseline is printed before the agent starts; model text streams after it.
    while time.monotonic() < deadline and proc.poll() is None:
        seen = out.data.split(b"tests suite before", 1)
        if len(seen) == 2 and len(seen[1].split(b"\n", 1)[-1]) > 200:
            break
        time.sleep(0.2)
    assert proc.poll() is None, out.text()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1].decode(errors="replace")
    text = out.text()
    assert proc.returncode == ExitCode.INTERRUPTED, text[-3000:] + err
    assert not [c for c in CRASHES if c in err + text], err
    assert "interrupted" in err
    assert recorded_codes(repo) == (ExitCode.INTERRUPTED, ExitCode.INTERRUPTED)
    assert "return a - b" in (repo / "calculator.py").read_text()


def test_a_prompt_too_long_before_any_model_call_says_so_once_and_exits_7(tmp_path: Path) -> None:
    """A window far smaller than the system prompt and the task: the backend refuses the first
    prompt, so no model call is made, and the summary does not count one."""
    model = write_tiny_checkpoint(tmp_path / "ckpt", seed=5, overrides={"max_position_embeddings": 1024})
    repo = calculator_repo(tmp_path)
    proc, out = start_fix(repo, model)
    proc.wait(timeout=900)  # not communicate(): it would read stdout too, taking lines from `out`
    err = proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
    text = out.text()
    assert proc.returncode == ExitCode.AGENT_ERROR, text[-3000:] + err
    assert not [c for c in CRASHES if c in err + text], err
    (message,) = [line for line in err.splitlines() if line.startswith("clover-agent:")]  # one message
    assert "the system prompt and the task alone are" in message and "holds 1,024" in message
    assert "no model call was made" in message and "Condensing" not in message
    assert "  agent       error; no model call made; backend engine:" in text, text[-2000:]
    assert "cut off" not in text and "model call," not in text
    # Resuming with the same model would be refused again: the hint asks for another one.
    assert "continue it with: " not in err and "a model of a larger context window: clover-agent fix" in err
    assert recorded_codes(repo) == (ExitCode.AGENT_ERROR, ExitCode.AGENT_ERROR)
    (run,) = run_dirs(repo)
    kinds = [json.loads(line)["type"] for line in (run / TRAJECTORY_FILE).read_text().splitlines()]
    assert kinds.count("prompt_refused") == 1 and "model_responded" not in kinds


def test_a_run_records_the_checkpoint_clover_model_named(tmp_path: Path) -> None:
    """No --model: the engine's checkpoint comes from CLOVER_MODEL, and the run records that folder,
    so resuming it from a shell without the variable uses the same weights."""
    model = write_tiny_checkpoint(tmp_path / "ckpt", seed=5, overrides={"max_position_embeddings": 1024})
    repo = calculator_repo(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--backend", "engine",
         "--sandbox", "local", "--dry-run"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "CLOVER_MODEL": str(model)},
    )  # fmt: skip
    assert done.returncode == ExitCode.AGENT_ERROR, done.stdout[-3000:] + done.stderr  # the tiny window
    (run,) = run_dirs(repo)
    started = json.loads((run / TRAJECTORY_FILE).read_text().splitlines()[0])
    assert started["type"] == "task_started" and started["launch"]["backend"] == "engine"
    assert started["launch"]["model"] == str(model.resolve())
