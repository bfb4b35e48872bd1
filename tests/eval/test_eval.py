"""``clover-agent eval`` end to end on a small real project (``--sandbox local``: real fix runs,
real pytest, real git): the gold replay resolves it and the verdict agrees, the empty one and a
gaming patch do not, predictions load as swebench reads them, a set-up failure is reported while
the other tasks go on, a second run resumes, and Ctrl-C keeps the finished tasks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.eval.scripts import write_replay
from tests.cli_process import start_signalable
from tests.eval.tasks_fixture import write_project, write_task

pytestmark = pytest.mark.slow


def run_eval(tasks: Path, out: Path, *flags: str) -> int:
    return main(["eval", str(tasks), "--output-dir", str(out), "--sandbox", "local", "-q", *flags])


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def predictions(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def check_swebench_predictions(path: Path) -> None:
    """The predictions as the swebench package reads them where it is installed; else its
    documented fields (instance_id, model_name_or_path, model_patch, all strings)."""
    try:
        from swebench.harness.utils import get_predictions_from_file  # type: ignore[import-not-found]
    except ImportError:
        for entry in [json.loads(line) for line in path.read_text().splitlines()]:
            assert set(entry) == {"instance_id", "model_name_or_path", "model_patch"}
            assert all(isinstance(v, str) for v in entry.values())
        return
    loaded = get_predictions_from_file(str(path), "SWE-bench/SWE-bench_Lite", "test")
    assert loaded and all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in loaded)


def test_gold_resolves_the_task_and_the_verdict_agrees(tmp_path: Path) -> None:
    write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    prices = ("--price-in", "3", "--price-out", "15")
    assert run_eval(tmp_path / "tasks", tmp_path / "out", "--gold", *prices) == 0
    summary = report(tmp_path / "out")
    assert summary["resolved"] == 1 and summary["disagreements"] == [] and summary["errors"] == []
    (result,) = summary["results"]
    # tokens/s and cost come from the run's own token counts and times
    # a replay's turns are read, not generated: their rate is over the agent's time, never millions
    # of tokens a second over microseconds of "generation"
    assert result["model_s"] < 0.1 and result["tokens_per_s_over"] == "agent"
    assert result["tokens_per_s"] == pytest.approx(result["tokens_out"] / result["agent_s"], rel=0.01)
    expected = (result["tokens_in"] * 3 + result["tokens_out"] * 15) / 1e6
    assert result["cost"] == pytest.approx(expected) and summary["cost"] == pytest.approx(expected)
    assert summary["cost_per_resolved"] == pytest.approx(expected)  # one resolved task
    assert result["verdict"] == "fixed" and result["grade"]["FAIL_TO_PASS"] == {
        "tests/test_calc.py::test_mean": "passed"
    }
    assert result["steps"] >= 2 and result["tokens_in"] > 0
    (prediction,) = predictions(tmp_path / "out")
    assert prediction["instance_id"] == "calc-mean" and prediction["model_name_or_path"] == "gold"
    assert "+    return sum(values) / len(values)" in prediction["model_patch"]
    check_swebench_predictions(tmp_path / "out" / "predictions.jsonl")
    table = (tmp_path / "out" / "report.md").read_text()
    assert "Resolved 1 of 1 (100.0%)" in table and "| calc-mean | fixed | 0 | resolved | yes |" in table


def test_the_empty_patch_resolves_nothing(tmp_path: Path) -> None:
    write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    with pytest.raises(SystemExit):  # one price alone would make a wrong cost
        run_eval(tmp_path / "tasks", tmp_path / "out", "--empty", "--price-in", "-1", "--price-out", "2")
    assert run_eval(tmp_path / "tasks", tmp_path / "out", "--empty", "--price-in", "1") == 2
    prices = ("--price-in", "1", "--price-out", "2")
    assert run_eval(tmp_path / "tasks", tmp_path / "out", "--empty", *prices) == 0  # the verdict agrees
    summary = report(tmp_path / "out")
    assert summary["resolved"] == 0 and summary["disagreements"] == []
    assert summary["results"][0]["verdict"] == "not fixed"
    # a cost, but none per resolved task with nothing resolved
    assert summary["cost"] > 0 and summary["cost_per_resolved"] is None
    assert " in all, — per resolved task" in (tmp_path / "out" / "report.md").read_text()
    assert predictions(tmp_path / "out")[0]["model_patch"] == ""


def _call(name: str, **args: str) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def test_a_gaming_patch_is_unresolved_and_not_fixed(tmp_path: Path) -> None:
    """The model edits the failing test to expect the wrong value and adds a conftest that skips
    every test: the grade puts the test patch back (and a skipped test is not a pass), and fix's
    held-out verification does not call it fixed."""
    write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    conftest = "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n    for item in items:\n        item.add_marker(pytest.mark.skip(reason='gamed'))\n"
    replay = write_replay(
        tmp_path / "gaming.jsonl",
        [
            _call(
                "editor",
                command="str_replace",
                path="/workspace/tests/test_calc.py",
                old_str="    assert mean([1, 2, 3]) == 2",
                new_str="    assert mean([1, 2, 3]) == 3",
            ),
            _call("editor", command="create", path="/workspace/conftest.py", file_text=conftest),
            _call("finish", summary="The tests pass."),
        ],
    )
    assert run_eval(tmp_path / "tasks", tmp_path / "out", "--replay", str(replay)) == 0
    summary = report(tmp_path / "out")
    (result,) = summary["results"]
    assert result["resolved"] is False and result["fixed"] is False and result["agree"] is True
    # no price: no cost, never a made-up number
    assert summary["cost"] is None and summary["cost_per_resolved"] is None and result["cost"] is None
    assert "Cost: — in all, — per resolved task" in (tmp_path / "out" / "report.md").read_text()
    assert result["verdict"] != "fixed"
    assert result["grade"]["FAIL_TO_PASS"]["tests/test_calc.py::test_mean"] != "passed"
    assert "conftest.py" in predictions(tmp_path / "out")[0]["model_patch"]


def test_broken_tool_calls_are_counted_and_named(tmp_path: Path) -> None:
    """A replay as a weak model writes it: an unreadable call, a call to a tool that does not
    exist, a turn with no call at all, then a good finish; each broken one is counted and its
    reason kept, in report.json and the table, and the task still ends with a verdict."""
    write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    replay = write_replay(
        tmp_path / "weak.jsonl",
        [
            "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</tool_call>",  # never closed
            _call("teleport", where="/workspace"),
            "I think the bug is in calc.py.",
            _call("finish", summary="I could not fix it."),
        ],
    )
    assert run_eval(tmp_path / "tasks", tmp_path / "out", "--replay", str(replay)) == 0
    summary = report(tmp_path / "out")
    (result,) = summary["results"]
    assert result["verdict"] == "not fixed" and summary["errors"] == []
    assert result["broken_tool_calls"] == 2 and result["turns_without_tool_call"] == 1
    reasons = result["broken_tool_call_reasons"]
    assert len(reasons) == 2 and any("teleport" in reason for reason in reasons)
    table = (tmp_path / "out" / "report.md").read_text()
    assert "| calc-mean | not fixed | 1 | unresolved | yes | 4 | 2 | 1 |" in table
    assert "- calc-mean (2): " in table and "teleport" in table


def test_a_task_whose_set_up_fails_is_reported_the_others_go_on_and_a_second_run_resumes(
    tmp_path: Path,
) -> None:
    project = write_project(tmp_path / "proj")
    write_task(tmp_path / "tasks", "a-good", project)
    write_task(tmp_path / "tasks", "b-broken", project, setup=["echo the set-up breaks >&2; exit 3"])
    out = tmp_path / "out"
    assert run_eval(tmp_path / "tasks", out, "--gold") == 1  # a task could not be run
    summary = report(out)
    assert summary["errors"] == ["b-broken"] and summary["resolved_ids"] == ["a-good"]
    broken = next(r for r in summary["results"] if r["instance_id"] == "b-broken")
    assert broken["exit_code"] == 4 and "could not be run" in broken["error"]
    assert "b-broken" in (out / "report.md").read_text().split("Errors:")[1]
    good = (out / "results" / "a-good.json").read_text()
    # the second run skips the finished task and tries the broken one again
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "eval", str(tmp_path / "tasks"), "--output-dir", str(out),
         "--sandbox", "local", "--gold"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 of 2 task(s) already done" in proc.stdout
    assert "a-good: starting" not in proc.stdout and "b-broken: starting" in proc.stdout
    assert (out / "results" / "a-good.json").read_text() == good
    assert report(out)["done"] == 2


def test_ctrl_c_keeps_the_finished_tasks(tmp_path: Path) -> None:
    project = write_project(tmp_path / "proj")
    write_task(tmp_path / "tasks", "a-first", project)
    # Ctrl-C comes while the second task's set-up command runs (it says so with a file). The child
    # gets SIGINT at its default disposition: a suite started in the background by a shell has it
    # ignored, and eval (rightly) keeps an ignored signal ignored.
    running = tmp_path / "set-up-running"
    write_task(tmp_path / "tasks", "b-slow", project, setup=[f"touch {running} && sleep 40"])
    out = tmp_path / "out"
    proc = start_signalable(
        [sys.executable, "-m", "clover_agent", "eval", str(tmp_path / "tasks"), "--output-dir", str(out),
         "--sandbox", "local", "--gold"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    first = out / "results" / "a-first.json"
    deadline = time.monotonic() + 600
    while not first.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.is_file(), proc.communicate()[0]
    while not running.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running.is_file(), proc.communicate()[0]
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 130, output
    summary = report(out)
    assert (
        summary["done"] == 1 and summary["not_done"] == ["b-slow"] and summary["resolved_ids"] == ["a-first"]
    )
    assert [p["instance_id"] for p in predictions(out)] == ["a-first"]
    assert "interrupted: 1 of 2 task(s) done" in output
