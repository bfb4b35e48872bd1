"""Front ends through ``--backend openai --base-url`` against one ``serve`` on a tiny checkpoint:
``fix``, ``eval --jobs 4`` and ``doctor --base-url``. The random model fixes nothing; what is
checked is that the runs complete and every model call they report reached the server (its
/metrics and the batch engine's counts agree with the runs' own)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.errors import ExitCode
from clover_agent.serve.app import Served
from clover_agent.serve.server import serving_in_thread
from tests.cli_process import run_cli
from tests.eval.tasks_fixture import write_project, write_task
from tests.serve.servers import served_model

pytestmark = pytest.mark.slow

#: Each answer is short: the tiny model writes noise, and a CPU decodes ~20 tokens a second.
ANSWER_TOKENS = 24


@pytest.fixture(scope="module")
def server(real_vocab_checkpoint: Path) -> Iterator[tuple[Served, str]]:
    served = served_model(real_vocab_checkpoint, max_new_tokens=ANSWER_TOKENS)
    with serving_in_thread(served) as base_url:
        yield served, base_url


def _requests(served: Served) -> tuple[int, int]:
    """(completed requests, prompt tokens) the server counted."""
    return served.metrics.outcomes["completed"], served.metrics.tokens["prompt"]


def _git_repo(root: Path) -> Path:
    project = write_project(root)
    (project / "tests" / "test_calc.py").write_text(
        "from calc import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"
    )
    for command in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "bug"],
    ):
        subprocess.run(["git", *command], cwd=project, check=True)
    return project


def test_fix_runs_against_serve(server: tuple[Served, str], tmp_path: Path) -> None:
    served, base_url = server
    before = _requests(served)
    repo = _git_repo(tmp_path / "project")
    done = run_cli(
        "fix", "test_mean", "--repo", str(repo), "--sandbox", "local", "--base-url", base_url,
        "--max-steps", "2", "--dry-run", timeout=600,
    )  # fmt: skip
    assert done.returncode == ExitCode.BUDGET_EXHAUSTED, done.stderr
    reported = re.search(r"(\d+) model calls; ([\d,]+) tokens in", done.stdout)
    assert reported, done.stdout
    calls, tokens_in = int(reported.group(1)), int(reported.group(2).replace(",", ""))
    after = _requests(served)
    assert calls == 2 and after[0] - before[0] == calls
    assert after[1] - before[1] == tokens_in


def test_eval_with_four_jobs_against_one_serve(server: tuple[Served, str], tmp_path: Path) -> None:
    served, base_url = server
    before, engine_before = _requests(served), served.batch.stats()
    project = write_project(tmp_path / "project")
    ids = [f"calc-mean-{i}" for i in range(4)]
    for instance_id in ids:
        write_task(tmp_path / "tasks", instance_id, project)
    done = run_cli(
        "eval", str(tmp_path / "tasks"), "--output-dir", str(tmp_path / "out"), "--sandbox", "local",
        "--base-url", base_url, "--max-steps", "2", "--jobs", "4", "-q", timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    results = {r["instance_id"]: r for r in report["results"]}
    assert sorted(results) == ids
    assert all(not r["error"] and not r["resolved"] for r in results.values()), results
    after, engine_after = _requests(served), served.batch.stats()
    assert sum(r["steps"] for r in results.values()) == after[0] - before[0] == 8
    assert sum(r["tokens_in"] for r in results.values()) == after[1] - before[1]
    assert engine_after.finished - engine_before.finished == 8


def test_doctor_checks_a_serve_server(server: tuple[Served, str]) -> None:
    _, base_url = server
    done = run_cli("doctor", "--json", "--base-url", base_url, timeout=300)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["server"]["ok"] and "serves 'clover' (healthy)" in checks["server"]["detail"]
    assert "gpu" not in checks  # the server's machine has the model, not this one
    missing = run_cli("doctor", "--json", "--base-url", base_url, "--model-name", "gpt-4o", timeout=300)
    check = {c["name"]: c for c in json.loads(missing.stdout)["checks"]}["server"]
    assert not check["ok"] and "does not serve the model 'gpt-4o'" in check["detail"]
    assert missing.returncode == ExitCode.FAILURE
