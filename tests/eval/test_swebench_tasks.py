"""SWE-bench datasets as published load: their field types (``repo`` "owner/name" at
``base_commit``, FAIL_TO_PASS / PASS_TO_PASS as JSON text, ``version``,
``environment_setup_commit``...), any runner's test ids kept as data, JSON Lines, a JSON list and
parquet; a bad line is named and skipped while the rest loads; a task whose ids the harness cannot
run fails as a task, with why, when it is run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from clover_agent.eval.harness import EvalOptions, run_task
from clover_agent.eval.tasks import TaskError, load_tasks
from clover_agent.settings import Settings
from tests.eval.tasks_fixture import CALC, FIXED, NEW_TESTS, TESTS, diff

BASE = "e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1"
SETUP = "0123456789abcdef0123456789abcdef01234567"


def swebench_line(instance_id: str, repo: str, f2p: object, p2p: object, **extra: object) -> dict:
    """A dataset line with the fields and field types of the published SWE-bench files."""
    return {
        "repo": repo,
        "instance_id": instance_id,
        "base_commit": BASE,
        "patch": diff("calc.py", CALC, FIXED),
        "test_patch": diff("tests/test_calc.py", TESTS, NEW_TESTS),
        "problem_statement": "mean() is wrong\n",
        "hints_text": "",
        "created_at": "2023-03-14T12:00:00Z",
        "version": "2.0",
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "environment_setup_commit": SETUP,
        **extra,
    }


REQUESTS = swebench_line(
    "psf__requests-2317",
    "psf/requests",
    json.dumps(["test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE"]),
    json.dumps(["test_requests.py::RequestsTestCase::test_BASICAUTH_TUPLE_HTTP_200_OK_GET"]),
)
DJANGO = swebench_line(
    "django__django-11099",
    "django/django",
    json.dumps(["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]),
    json.dumps(
        [
            "test_help_text (auth_tests.test_validators.MinimumLengthValidatorTest)",
            "Regression test for #10348: the help text is shown.",
        ]
    ),
    version="3.0",
)
SYMPY = swebench_line(
    "sympy__sympy-20590",
    "sympy/sympy",
    ["test_immutable"],
    ["test__aresame", "test_structure"],
    version="1.7",
)


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_published_lines_of_three_runners_load_with_their_fields(tmp_path: Path) -> None:
    tasks = load_tasks(write_jsonl(tmp_path / "swe.jsonl", [REQUESTS, DJANGO, SYMPY]))
    requests, django, sympy = tasks
    assert requests.repo.kind == "git" and requests.repo.value == "https://github.com/psf/requests.git"
    assert requests.repo.commit == BASE
    assert requests.fail_to_pass == ("test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE",)
    assert requests.unrunnable == ""
    assert requests.swebench["environment_setup_commit"] == SETUP
    assert requests.source["repo"] == "psf/requests" and requests.source["version"] == "2.0"
    # django's ids, docstring lines included, are kept exactly as given
    assert django.fail_to_pass == (
        "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
    )
    assert django.pass_to_pass[1] == "Regression test for #10348: the help text is shown."
    assert django.swebench["version"] == "3.0" and django.repo.value == "https://github.com/django/django.git"
    assert "django's test runner" in django.unrunnable and "pytest-style" in django.unrunnable
    assert sympy.fail_to_pass == ("test_immutable",) and "bare test name" in sympy.unrunnable
    instance = django.to_instance()
    assert instance["environment_setup_commit"] == SETUP and instance["base_commit"] == BASE


def test_a_json_list_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "swe.json"
    path.write_text(json.dumps([REQUESTS, DJANGO]))
    assert [t.instance_id for t in load_tasks(path)] == ["psf__requests-2317", "django__django-11099"]


def test_a_bad_line_is_named_and_skipped_and_the_rest_loads(tmp_path: Path) -> None:
    no_commit = {k: v for k, v in SYMPY.items() if k != "base_commit"}
    lines = [
        REQUESTS,
        "{not json",
        {**DJANGO, "FAIL_TO_PASS": "[]"},
        no_commit,
        {**SYMPY, "repo": "psf-requests"},
        {**REQUESTS, "base_commit": "--upload-pack=touch x"},
        DJANGO,
        {**REQUESTS, "problem_statement": "again"},  # a repeated id
    ]
    skipped: list[str] = []
    tasks = load_tasks(write_jsonl(tmp_path / "swe.jsonl", lines), on_skip=skipped.append)
    assert [t.instance_id for t in tasks] == ["psf__requests-2317", "django__django-11099"]
    assert len(skipped) == 6
    assert "swe.jsonl:2: not valid JSON" in skipped[0]
    assert "swe.jsonl:3: FAIL_TO_PASS is empty" in skipped[1]
    assert "swe.jsonl:4: repo 'sympy/sympy' is a GitHub repository: base_commit must say" in skipped[2]
    assert "swe.jsonl:5: repo 'psf-requests' must be \"owner/name\"" in skipped[3]
    assert "swe.jsonl:6: base_commit '--upload-pack=touch x' is not a commit id" in skipped[4]
    assert "swe.jsonl:8: instance_id 'psf__requests-2317' is also the id of" in skipped[5]


def test_a_file_of_only_bad_lines_says_why(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"no tasks found \(1 skipped: .*swe.jsonl:1: FAIL_TO_PASS is empty"):
        load_tasks(
            write_jsonl(tmp_path / "swe.jsonl", [{**REQUESTS, "FAIL_TO_PASS": []}]), on_skip=lambda m: None
        )


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "test-00000-of-00001.parquet"
    try:
        import pyarrow  # type: ignore[import-not-found, unused-ignore]
        import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(TaskError, match=r"parquet needs the pyarrow package.*pip install pyarrow"):
            load_tasks(path)
        return
    pq.write_table(pyarrow.Table.from_pylist([REQUESTS, DJANGO]), path)
    tasks = load_tasks(path)
    assert [t.instance_id for t in tasks] == ["psf__requests-2317", "django__django-11099"]
    assert tasks[1].swebench["version"] == "3.0"


def test_a_task_whose_ids_the_harness_cannot_run_fails_with_why_when_run(tmp_path: Path) -> None:
    (django,) = load_tasks(write_jsonl(tmp_path / "swe.jsonl", [DJANGO]))
    settings = Settings(config_path=tmp_path / "none.toml", home=tmp_path / "home")
    options = EvalOptions(output_dir=tmp_path / "out", settings=settings, mode="empty", sandbox_kind="local")
    result = asyncio.run(run_task(django, options))
    assert result["error"].startswith("the task could not be run: test id 'test_ascii_validator (")
    assert "django's test runner" in result["error"] and not result["resolved"]
    # nothing was fetched for it
    assert not (tmp_path / "out" / "work" / django.instance_id / "base").exists()
    assert not (tmp_path / "home" / "git").exists()


def test_our_own_task_format_keeps_its_sdist_shorthand(tmp_path: Path) -> None:
    line = {**REQUESTS, "repo": "requests==2.31.0"}
    del line["base_commit"]
    (task,) = load_tasks(write_jsonl(tmp_path / "own.jsonl", [line]))
    assert task.repo.kind == "sdist" and task.repo.value == "requests==2.31.0"


def test_which_ids_the_harness_runs(tmp_path: Path) -> None:
    runnable = ["tests/t.py::T::test_x[a-b]", "tests/t.py", "src/pkg/mod.py::pkg.mod.func", "tests/unit/"]
    spaced = "tests/t.py::test_x[1 + 1]"
    lines = [
        swebench_line("ok-1", "octo/calc", runnable, []),
        swebench_line("spaced-1", "octo/calc", [spaced], []),
    ]
    ok, spaced_task = load_tasks(write_jsonl(tmp_path / "swe.jsonl", lines))
    assert ok.unrunnable == "" and ok.fail_to_pass == tuple(runnable)
    assert spaced_task.fail_to_pass == (spaced,) and "holds a space" in spaced_task.unrunnable
