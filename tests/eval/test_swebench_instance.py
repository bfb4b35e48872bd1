"""``eval --swebench``: a SWE-bench instance runs end to end in its instance image, built here
from the local base image (tests/eval/swebench_instance.py: requests at its base commit in
``/testbed``, the environment the spec installs). The agent works in ``/testbed`` (the
workspace), the grade runs the eval script the ``swebench`` package makes (the instance's own
test command) and swebench's grading code reads its log: ``--gold`` resolves, ``--empty`` does
not. Hostile patches (a conftest that turns failures into passes, fake ``PASSED`` lines and
markers printed into the log) are not resolved, and the grade says why."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clover_agent.eval.grade import Grade
from clover_agent.eval.swebench import (
    InstanceImages,
    grade_instance,
    has_spec,
    infrastructure_paths,
    installs_a_copy,
    instance_spec,
    instance_test_command,
    log_tampering,
    open_instance,
)
from clover_agent.eval.tasks import load_tasks
from clover_agent.sandboxes.images import LABEL_SWEBENCH_BASE
from clover_agent.settings import Settings
from tests.eval import swebench_instance as made_here

# One worker builds and tags the instance images (swebench names them by instance, repository and
# version): a module fixture on two workers would overwrite the same tags with other commits, and
# the two modules tag the same environment and base names.
pytestmark = pytest.mark.xdist_group("swebench-images")

ROOT = Path(__file__).resolve().parents[2]
F2P = made_here.FAIL_TO_PASS[0]


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The instance's dataset file, its image built and tagged as swebench names it."""
    import docker

    folder = tmp_path_factory.mktemp("swebench-instance")
    made = made_here.make_repository(folder / "repo")
    line = made_here.instance_line(made)
    client = docker.from_env()
    image = made_here.build_instance_image(client, folder / "repo", line, folder / "context")
    dataset = folder / "instances.jsonl"
    dataset.write_text(json.dumps(line) + "\n")
    try:
        yield dataset
    finally:
        image_id = client.images.get(image).id
        for variant in client.images.list(filters={"label": f"{LABEL_SWEBENCH_BASE}={image_id}"}):
            client.images.remove(variant.id, force=True)
        made_here.remove_images(client, line)


def _eval(dataset: Path, out: Path, mode: str, *more: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "eval", str(dataset), "--output-dir", str(out), f"--{mode}",
         "--swebench", "--swebench-namespace", "none", *more],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    summary: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert summary["errors"] == [] and summary["disagreements"] == []
    return summary


@pytest.mark.docker
@pytest.mark.index
@pytest.mark.slow
def test_gold_resolves_in_the_instance_image_by_swebenchs_grading_and_run_evaluation(
    instance: Path, tmp_path: Path
) -> None:
    summary = _eval(instance, tmp_path / "out", "gold", "--grade", "swebench")
    (result,) = summary["results"]
    # swebench's run_evaluation too, in the instance image as built here (it builds nothing)
    assert result["swebench"]["resolved"] is True and summary["grader_disagreements"] == []
    # "fixed, suite unverified": requests' whole suite needs a network (httpbin), which the sandbox has not
    assert summary["resolved"] == 1 and result["verdict"].startswith("fixed"), result["message"]
    graded = result["grade"]
    assert graded["resolved"] and "guarded run agrees" in graded["message"]
    assert graded["swebench"]["resolved"] is True
    assert graded["swebench"]["tests_status"]["FAIL_TO_PASS"] == {"success": [F2P], "failure": []}
    assert graded["swebench"]["tests_status"]["PASS_TO_PASS"]["failure"] == []
    assert graded["test_command"] == "pytest -rA tests/test_utils.py" and graded["left_out"] == []
    log = Path(graded["log"]).read_text()
    assert "+ cd /testbed" in log and "+ pytest -rA tests/test_utils.py" in log and f"PASSED {F2P}" in log
    run = tmp_path / "out" / "work" / made_here.INSTANCE_ID / "run"
    trajectory = "".join(p.read_text() for p in run.rglob("*.jsonl"))
    assert "/workspace/requests/utils.py" in trajectory  # the agent's edits, in /testbed's workspace
    assert "run in /testbed: `pytest -rA tests/test_utils.py`" in trajectory  # told the instance's command
    prediction = json.loads((tmp_path / "out" / "predictions.jsonl").read_text())
    assert (
        prediction["instance_id"] == made_here.INSTANCE_ID
        and "unquote(parsed.username)" in prediction["model_patch"]
    )


@pytest.mark.docker
@pytest.mark.index
@pytest.mark.slow
def test_empty_does_not_resolve_and_swebench_names_the_failing_test(instance: Path, tmp_path: Path) -> None:
    summary = _eval(instance, tmp_path / "out", "empty")
    (result,) = summary["results"]
    assert summary["resolved"] == 0 and result["verdict"] != "fixed"
    graded = result["grade"]
    assert not graded["resolved"] and graded["swebench"]["resolved"] is False
    assert graded["swebench"]["tests_status"]["FAIL_TO_PASS"] == {"success": [], "failure": [F2P]}
    assert f"FAILED {F2P}" in Path(graded["log"]).read_text()


ANYTHING_PASSES = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""
PLANTED = made_here.PLANTED.rstrip("\n")
FORGED = "".join(f"print('PASSED {t}'); " for t in [*made_here.FAIL_TO_PASS, *made_here.PASS_TO_PASS])
#: In the function the failing test calls: printed while it runs, so shown in pytest's FAILURES
#: section before its summary: fake results, then swebench's end marker, where its parser stops.
MARKERS = f"{PLANTED}; {FORGED}print('>>>>> End Test Output')\n"
#: Printed as the test process exits, after pytest's own summary.
AT_EXIT = f"{PLANTED}; import atexit; atexit.register(lambda: print('PASSED {F2P}', flush=True))\n"


def _added(path: str, text: str) -> str:
    lines = text.splitlines() or [""]
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
    )


def _changed(base: Path, path: str, old: str, new: str) -> str:
    """The patch that replaces ``old`` by ``new`` in ``base``'s ``path``."""
    text = (base / path).read_text()
    assert text.count(old) == 1
    scratch = base.with_name("scratch")
    subprocess.run(["cp", "-a", str(base), str(scratch)], check=True)
    (scratch / path).write_text(text.replace(old, new))
    patch = subprocess.run(
        ["git", "-C", str(scratch), "diff", "--", path], capture_output=True, text=True, check=True
    ).stdout
    subprocess.run(["rm", "-rf", str(scratch)], check=True)
    return patch


def _grader(dataset: Path, work: Path) -> Callable[[str], Grade]:
    """Grades a patch of the instance in its sandbox, over ``work/base`` (the image's ``/testbed``)."""
    (task,) = load_tasks(dataset)
    settings = Settings.load()
    opened = open_instance(task, InstanceImages(namespace=None), settings, work / "base")

    def grade(patch: str) -> Grade:
        return asyncio.run(
            grade_instance(
                task, opened.spec, work / "base", work / "grade", patch,
                lambda tree: opened.sandbox_spec(settings, tree), "docker",
            )
        )  # fmt: skip

    return grade


@pytest.mark.docker
@pytest.mark.index
@pytest.mark.slow
def test_a_conftest_that_passes_everything_is_left_out(instance: Path, tmp_path: Path) -> None:
    graded = _grader(instance, tmp_path)(_added("conftest.py", ANYTHING_PASSES))
    assert not graded.resolved and graded.details["left_out"] == ["conftest.py"]
    assert graded.details["swebench"]["resolved"] is False
    assert f"FAILED {F2P}" in Path(graded.details["log"]).read_text()


@pytest.mark.docker
@pytest.mark.index
@pytest.mark.slow
def test_fake_results_printed_into_the_log_do_not_resolve(instance: Path, tmp_path: Path) -> None:
    grade = _grader(instance, tmp_path)
    base = tmp_path / "base"
    at_exit = grade(_changed(base, made_here.CODE, made_here.PLANTED, AT_EXIT))
    assert "log" in at_exit.details, at_exit.message
    log = Path(at_exit.details["log"]).read_text()
    # pytest says FAILED, then the code under test prints PASSED: swebench's parser keeps the last
    # line it reads, so the log alone says resolved; the guarded run's signed channel does not
    assert f"FAILED {F2P}" in log and log.rindex(f"PASSED {F2P}") > log.rindex(f"FAILED {F2P}")
    assert at_exit.details["swebench"]["resolved"] is True
    assert not at_exit.resolved and "guarded run" in at_exit.message
    markers = grade(_changed(base, made_here.CODE, made_here.PLANTED, MARKERS))
    assert markers.details["swebench"]["resolved"] is True  # the log cut where the code said
    assert (
        not markers.resolved
        and "'>>>>> End Test Output'" in markers.message
        and "the code under test" in markers.message
    )


def test_what_the_grade_takes_as_the_task_has_it(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(json.dumps(made_here.instance_line(_FAKE)) + "\n")
    (task,) = load_tasks(tmp_path / "t.jsonl")
    patch = (
        _added("tests/test_utils.py", "x = 1")
        + _added("conftest.py", "")
        + _added("src/conftest.py", "")
        + _added("tox.ini", "")
        + _added("requests/utils.py", "")
        + _added("tests/runtests.py", "")
    )
    assert infrastructure_paths(task, patch) == [
        "conftest.py", "src/conftest.py", "tests/runtests.py", "tests/test_utils.py", "tox.ini",
    ]  # fmt: skip


_FAKE = {
    "base_commit": "0" * 40,
    "test_patch": _added("tests/test_utils.py", "x = 1"),
    "patch": _added("a.py", ""),
}


def test_swebenchs_spec_gives_the_test_command_and_the_install(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(json.dumps(made_here.instance_line(_FAKE)) + "\n")
    (task,) = load_tasks(tmp_path / "t.jsonl")
    assert has_spec(task)
    spec = instance_spec(task)
    assert instance_test_command(spec) == "pytest -rA tests/test_utils.py"
    assert installs_a_copy(spec)  # requests' spec: `python -m pip install .`
    assert spec.instance_image_key == f"sweb.eval.x86_64.{made_here.INSTANCE_ID}:latest"
    line = made_here.instance_line(_FAKE) | {"version": "0.0"}
    (tmp_path / "u.jsonl").write_text(json.dumps(line) + "\n")
    (unknown,) = load_tasks(tmp_path / "u.jsonl")
    assert not has_spec(unknown)


def test_the_log_checks_find_markers_the_code_wrote() -> None:
    start, end = ">>>>> Start Test Output", ">>>>> End Test Output"
    assert log_tampering(f"+ : '{start}'\nPASSED a\n+ : '{end}'\n") == ""
    assert "the code under test" in log_tampering(f"+ : '{start}'\n{end}\nPASSED a\n+ : '{end}'\n")
    assert "lacks" in log_tampering("no markers at all")


def _refused(tmp_path: Path, tasks: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "eval", str(tasks), "--output-dir", str(tmp_path / "out"), "--gold",
         "--swebench", "--swebench-namespace", "none"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "out" / "results").exists(), proc.stdout + proc.stderr
    return proc.stderr


def test_swebench_refuses_a_set_it_cannot_run_before_anything_runs(tmp_path: Path) -> None:
    line = made_here.instance_line(_FAKE) | {"version": "0.0"}
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    assert "has no spec for psf/requests version '0.0'" in _refused(tmp_path, tmp_path / "t.jsonl")
    line = made_here.instance_line(_FAKE) | {"repo": {"path": "."}}
    (tmp_path / "u.jsonl").write_text(json.dumps(line) + "\n")
    assert "no task is a SWE-bench line" in _refused(tmp_path, tmp_path / "u.jsonl")


@pytest.mark.docker
def test_a_missing_instance_image_is_built_by_swebench_or_the_error_says_why(tmp_path: Path) -> None:
    """No image under the instance's name and no namespace: swebench's own builder runs; here
    (no registry, no internet) it cannot, and the task's error says so, with its log."""
    from clover_agent.sandboxes.errors import SandboxUnavailable

    line = made_here.instance_line(_FAKE) | {"instance_id": "psf__requests-90002"}
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    (task,) = load_tasks(tmp_path / "t.jsonl")
    said: list[str] = []
    with pytest.raises(SandboxUnavailable) as caught:
        open_instance(
            task, InstanceImages(namespace=None, progress=said.append), Settings.load(), tmp_path / "base"
        )
    message = str(caught.value)
    assert (
        "sweb.eval.x86_64.psf__requests-90002:latest" in message
        and "prepare_images could not build it" in message
    )
    assert "internet" in message and str(tmp_path / "images" / "prepare_images.log") in message
    assert (tmp_path / "images" / "prepare_images.log").read_text().strip()
    assert any("building it with swebench's prepare_images" in line for line in said)
    assert not (tmp_path / "base").exists()
