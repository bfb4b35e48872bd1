"""``eval --grade swebench``: SWE-bench's own harness (the real ``swebench`` package,
``swebench.harness.run_evaluation``) grades the patches in an instance-shaped image built here
from the local sandbox image (the repository at ``/testbed``, a ``testbed`` environment behind
``/opt/miniconda3/bin/activate``, the image named as the package names it), with the eval script
and test command the package's spec functions make for a requests-shaped instance: the gold replay
resolves, the empty one does not, a patch that breaks a PASS_TO_PASS test is unresolved and named,
one that does not apply is unresolved, and a line the package has no spec for is refused before
anything runs."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.errors import UsageError
from clover_agent.eval.swebench_grade import SwebenchGrade, check_tasks, grade_with_swebench, instance_line
from clover_agent.eval.tasks import load_tasks
from clover_agent.sandboxes.images import DEFAULT_SANDBOX_IMAGE
from tests.eval.tasks_fixture import CALC, FIXED, NEW_TESTS, TESTS, diff
from tests.eval.test_git_source import upstream
from tests.git_repos import git

# One worker builds and tags the instance images (swebench names them by instance, repository and
# version): a module fixture on two workers would overwrite the same tags with other commits, and
# the two modules tag the same environment and base names.
pytestmark = pytest.mark.xdist_group("swebench-images")

INSTANCE = "psf__requests-9999"
LABEL = "clover-agent.test"
#: What SWE-bench's instance images hold besides the repository: a conda environment ``testbed``
#: that the eval script activates. Here its ``python`` and ``pytest`` are the sandbox image's.
CONDA = """\
RUN mkdir -p /opt/miniconda3/bin /opt/miniconda3/envs/testbed/bin \\
 && printf 'conda() { export PATH=/opt/miniconda3/envs/testbed/bin:$PATH; }\\n' > /opt/miniconda3/bin/activate \\
 && ln -s /usr/bin/python3 /opt/miniconda3/envs/testbed/bin/python \\
 && printf '#!/bin/sh\\nexec python3 -m pytest -p no:cacheprovider "$@"\\n' > /opt/miniconda3/envs/testbed/bin/pytest \\
 && chmod +x /opt/miniconda3/envs/testbed/bin/pytest
"""


def swebench_line(base: str, **changes: object) -> dict[str, object]:
    """A SWE-bench line (the published fields and field types) of a requests-shaped instance:
    ``psf/requests`` at version 2.0, whose spec in the swebench package runs ``pytest -rA`` on the
    test patch's files."""
    return {
        "repo": "psf/requests",
        "instance_id": INSTANCE,
        "base_commit": base,
        "patch": diff("calc.py", CALC, FIXED),
        "test_patch": diff("tests/test_calc.py", TESTS, NEW_TESTS),
        "problem_statement": "mean([1, 2, 3]) returns 3.0 instead of 2.0.",
        "hints_text": "",
        "created_at": "2024-01-02T03:04:05Z",
        "version": "2.0",
        "environment_setup_commit": base,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_mean"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        **changes,
    }


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """The upstream repository as a GitHub-shaped mirror, and its instance image under a namespace
    of this test's own, named by the swebench package (the bug's commit at /testbed, FROM the local
    sandbox image): (mirror, base commit, namespace)."""
    import docker

    bare, bug, _ = upstream(tmp_path / "up")
    mirror = tmp_path / "mirror"
    (mirror / "psf").mkdir(parents=True)
    shutil.move(str(bare), mirror / "psf" / "requests.git")
    context = tmp_path / "image"
    git(tmp_path, "clone", "-q", str(mirror / "psf" / "requests.git"), str(context / "testbed"))
    git(context / "testbed", "checkout", "-q", bug)
    (context / "Dockerfile").write_text(
        f"FROM {DEFAULT_SANDBOX_IMAGE}\nUSER root\n{CONDA}COPY testbed /testbed\nWORKDIR /testbed\n"
    )
    namespace = f"clover-test-{uuid.uuid4().hex[:12]}"
    line_file = tmp_path / "line.jsonl"
    line_file.write_text(json.dumps(swebench_line(bug)) + "\n")
    image = check_tasks(load_tasks(line_file), namespace)[INSTANCE]
    assert image == f"{namespace}/sweb.eval.x86_64.psf_1776_requests-9999:latest"
    client = docker.from_env()
    client.images.build(path=str(context), tag=image, rm=True, labels={LABEL: "swebench-grade"})
    try:
        yield mirror, bug, namespace
    finally:
        client.images.remove(image, force=True)
        client.close()


@pytest.mark.docker
@pytest.mark.slow
def test_eval_gold_resolves_and_empty_does_not_by_swebenchs_own_grading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instance: tuple[Path, str, str]
) -> None:
    from clover_agent.cli import main

    mirror, base, namespace = instance
    tasks = tmp_path / "verified.jsonl"
    tasks.write_text(json.dumps(swebench_line(base)) + "\n")
    monkeypatch.setenv("CLOVER_HOME", str(tmp_path / "home"))
    flags = ["--sandbox", "local", "-q", "--git-mirror", str(mirror), "--grade", "swebench"]
    flags += ["--swebench-namespace", namespace]

    gold = tmp_path / "gold"
    assert main(["eval", str(tasks), "--output-dir", str(gold), "--gold", *flags]) == 0
    summary = json.loads((gold / "report.json").read_text())
    assert summary["grader"] == "swebench" and summary["resolved_ids"] == [INSTANCE]
    assert summary["disagreements"] == [] and summary["grader_disagreements"] == []
    (result,) = summary["results"]
    assert result["swebench"]["status"] == "resolved" and result["grade"]["resolved"] is True
    tests = result["swebench"]["tests"]
    assert tests["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_mean"]
    assert tests["PASS_TO_PASS"]["success"] == ["tests/test_calc.py::test_add"]
    # swebench's own logs: the model's patch applied in the container, the eval script its spec
    # functions made (the requests spec's test command on the test patch's file) run there
    log_dir = gold / Path(result["swebench"]["log"]).parent
    assert "pytest -rA tests/test_calc.py" in (log_dir / "eval.sh").read_text()
    assert "PASSED tests/test_calc.py::test_mean" in (log_dir / "test_output.txt").read_text()
    prediction = json.loads((gold / "predictions.jsonl").read_text())
    assert (log_dir / "patch.diff").read_text() == prediction["model_patch"]
    assert "Graded by SWE-bench's harness" in (gold / "report.md").read_text()

    empty = tmp_path / "empty"
    assert main(["eval", str(tasks), "--output-dir", str(empty), "--empty", *flags]) == 0
    summary = json.loads((empty / "report.json").read_text())
    assert summary["resolved"] == 0 and summary["errors"] == [] and summary["disagreements"] == []
    assert summary["results"][0]["swebench"]["status"] == "empty patch"


@pytest.mark.docker
@pytest.mark.slow
def test_a_changed_patch_is_graded_again_and_a_broken_test_is_named(
    tmp_path: Path, instance: tuple[Path, str, str]
) -> None:
    """Straight through the grader: the gold patch resolves; the same output folder with a patch
    that also breaks add() (FAIL_TO_PASS passes, PASS_TO_PASS fails) is graded afresh, not read
    from swebench's kept report, and is unresolved with the broken test named."""
    _, base, namespace = instance
    tasks_file = tmp_path / "verified.jsonl"
    tasks_file.write_text(json.dumps(swebench_line(base)) + "\n")
    tasks = load_tasks(tasks_file)
    out = tmp_path / "out"

    def graded_as(patch: str) -> SwebenchGrade:
        result = {"instance_id": INSTANCE, "model_name_or_path": "clover", "model_patch": patch}
        (graded,) = grade_with_swebench(tasks, [result], out, namespace=namespace).values()
        return graded

    graded = graded_as(tasks[0].patch)
    assert graded.resolved and graded.status == "resolved"
    graded = graded_as(diff("calc.py", CALC, FIXED.replace("return a + b", "return a - b")))
    assert not graded.resolved and graded.status == "unresolved"
    assert "PASS_TO_PASS: tests/test_calc.py::test_add" in graded.message
    assert graded.tests is not None
    assert graded.tests["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_mean"]
    # a patch that does not apply is unresolved, not an error of the harness
    graded = graded_as(diff("calc.py", "no such text\n", "other\n"))
    assert not graded.resolved and graded.status == "unresolved" and "does not apply" in graded.message


def test_a_line_swebench_cannot_grade_is_refused_before_anything_runs(tmp_path: Path) -> None:
    line = swebench_line("a" * 40)
    path = tmp_path / "swe.jsonl"
    for changed, match in (
        ({"repo": "octo/calc"}, r"swe.jsonl:1: swebench has no spec for repo 'octo/calc' version '2.0'"),
        ({"version": "0.0.1"}, r"no spec for repo 'psf/requests' version '0.0.1'"),
        ({"version": None}, r"swe.jsonl:1: --grade swebench needs the instance's version"),
    ):
        path.write_text(json.dumps({**line, **changed}) + "\n")
        with pytest.raises(UsageError, match=match):
            check_tasks(load_tasks(path))
    # a task folder's source ({"path": ...}) is no SWE-bench "owner/name"
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps({**line, "repo": {"path": str(tmp_path)}}))
    with pytest.raises(UsageError, match=r"needs the instance's repo\b"):
        check_tasks(load_tasks(folder))


def test_a_line_goes_to_swebench_with_its_fields_as_given(tmp_path: Path) -> None:
    line = swebench_line("b" * 40)
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (task,) = load_tasks(path)
    instance = instance_line(task)
    for key in ("repo", "instance_id", "base_commit", "version", "environment_setup_commit", "test_patch"):
        assert instance[key] == line[key]
    assert json.dumps(instance["FAIL_TO_PASS"]) == line["FAIL_TO_PASS"]
    # the images the package names: SWE-bench's published ones by default
    assert check_tasks([task]) == {INSTANCE: "swebench/sweb.eval.x86_64.psf_1776_requests-9999:latest"}
    assert check_tasks([task], "none") == {INSTANCE: "sweb.eval.x86_64.psf__requests-9999:latest"}
