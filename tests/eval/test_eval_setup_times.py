"""bench/eval_setup_times.py on a tiny local task in Docker: the task's environment image is
removed and made again by the cold start (once with pip, once with uv, back to back), the warm start says it is cached, both times are in
the JSON and the table, and a task whose start fails is named in a non-zero exit while the other
is still measured. The figures are not checked against a bound (timing is the bench's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.sandboxes.docker import docker_client
from clover_agent.sandboxes.env_image import LABEL_ENV_REPO, environment_images, remove_images
from clover_agent.settings import Settings
from tests.eval.tasks_fixture import write_project, write_task

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "eval_setup_times.py"


@pytest.fixture
def remove_environment_images(tmp_path: Path) -> Iterator[None]:
    """The environment images the script made for this test's task are removed afterwards (the
    script's repositories are under its own temporary folder, named after the task)."""
    yield
    client = docker_client(Settings.load().docker_env)
    try:
        mine = [i for i in environment_images(client) if "calc-setup-" in i["Labels"].get(LABEL_ENV_REPO, "")]
        remove_images(client, mine)
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.index
@pytest.mark.slow
def test_cold_then_warm_start_of_a_local_task(tmp_path: Path, remove_environment_images: None) -> None:
    project = write_project(tmp_path / "calc")
    tasks = tmp_path / "tasks"
    write_task(tasks, "calc-setup-1", project, setup=["echo set-up ran > /tmp/marker"])
    # a setup command that fails: the environment cannot be made, so this start fails
    write_task(tasks, "calc-setup-broken", project, setup=["exit 7"])
    write_task(tasks, "calc-setup-unused", project)
    out = tmp_path / "times.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tasks), "--only", "calc-setup-1", "calc-setup-broken",
         "--warm", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-6000:]
    assert "the start failed for: calc-setup-broken" in proc.stderr, log[-6000:]
    data = json.loads(out.read_text())
    rows = {r["instance_id"]: r for r in data["results"]}
    assert set(rows) == {"calc-setup-1", "calc-setup-broken"}  # --only: the third is not run
    good = rows["calc-setup-1"]
    assert good["error"] == ""
    # one cold start per installer, back to back (pip, then uv: the default now), each naming what ran
    assert set(good["cold_s"]) == {"pip", "uv"} and all(s > 0 for s in good["cold_s"].values())
    assert good["installer_ran"] == {"pip": "pip", "uv": "uv"}
    assert len(good["warm_s"]) == 2 and all(s > 0 for s in good["warm_s"])
    assert good["warm_cached"] == [True, True]
    assert good["image"].startswith("clover-agent-env:") and good["image_bytes"] > 0
    assert "set-up failed" in rows["calc-setup-broken"]["error"]
    assert "environment: setting the project up" in proc.stdout  # the cold start made the image
    assert f"environment: cached ({good['image']})" in proc.stdout
    assert "| calc-setup-1 | path " in proc.stdout and "| calc-setup-broken | path " in proc.stdout
    assert "pip: cold median" in proc.stdout and "uv: cold median" in proc.stdout
    assert "pip/uv per task: median" in proc.stdout


def test_only_names_an_unknown_task(tmp_path: Path) -> None:
    write_task(tmp_path / "tasks", "calc-setup-2", write_project(tmp_path / "calc"))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "tasks"), "--only", "no-such-task"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "no task no-such-task" in proc.stderr
