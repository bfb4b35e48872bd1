"""The task format's loader: the shipped set loads, and each way a task can be wrong is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.eval.tasks import TaskError, load_tasks
from tests.eval.tasks_fixture import write_project, write_task

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_tasks_load_and_say_where_they_come_from() -> None:
    tasks = load_tasks(ROOT / "bench" / "tasks")
    assert len(tasks) >= 20
    assert len({t.repo.value.split("==")[0] for t in tasks}) >= 8
    for task in tasks:
        assert task.repo.kind == "sdist" and task.fail_to_pass
        assert task.source.get("bug_in") and task.source.get("fixed_in")


def test_a_jsonl_file_loads_and_a_bad_line_is_named_and_skipped(tmp_path: Path) -> None:
    folder = write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    data = json.loads((folder / "task.json").read_text())
    data["test_patch"] = (folder / "test.patch").read_text()
    data["patch"] = (folder / "gold.patch").read_text()
    good = tmp_path / "set.jsonl"
    good.write_text(json.dumps(data) + "\n\n" + json.dumps({**data, "instance_id": "other"}) + "\n")
    assert [t.instance_id for t in load_tasks(good)] == ["calc-mean", "other"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(data) + "\n" + json.dumps({**data, "FAIL_TO_PASS": []}) + "\n")
    skipped: list[str] = []
    assert [t.instance_id for t in load_tasks(bad, on_skip=skipped.append)] == ["calc-mean"]
    assert len(skipped) == 1 and "bad.jsonl:2: FAIL_TO_PASS is empty" in skipped[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"instance_id": "a b"}, "instance_id 'a b'"),
        ({"repo": {"sdist": "toolz>=1"}}, "must be a pinned name==version"),
        ({"repo": {"sdist": "x==1", "path": "."}}, "repo must be one of"),
        ({"FAIL_TO_PASS": "tests/x.py::t"}, "FAIL_TO_PASS must be a list"),
        ({"PASS_TO_PASS": ["-x"]}, "is not a test id"),
        ({"patch": "not a diff"}, "patch is not a unified diff"),
        ({"problem_statement": " "}, "problem_statement must be a non-empty string"),
        ({"environment": {"image": "x"}}, "environment may set only"),
        ({"setup": [1]}, "setup must be a list"),
    ],
)
def test_a_wrong_field_is_named(tmp_path: Path, change: dict, message: str) -> None:
    folder = write_task(tmp_path / "tasks", "calc-mean", write_project(tmp_path / "proj"))
    data = json.loads((folder / "task.json").read_text())
    (folder / "task.json").write_text(json.dumps({**data, **change}))
    with pytest.raises(TaskError, match=message):
        load_tasks(folder)


def test_duplicate_ids_and_an_empty_set_are_errors(tmp_path: Path) -> None:
    project = write_project(tmp_path / "proj")
    write_task(tmp_path / "tasks", "one", project)
    copy = write_task(tmp_path / "tasks", "two", project)
    data = json.loads((copy / "task.json").read_text())
    (copy / "task.json").write_text(json.dumps({**data, "instance_id": "one"}))
    with pytest.raises(TaskError, match="is also the id of"):
        load_tasks(tmp_path / "tasks")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no tasks found"):
        load_tasks(tmp_path / "empty")
