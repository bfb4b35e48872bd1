"""``clover-agent fix`` on real third-party projects, with the default Docker sandbox and default
flags: each project's pinned sdist is fetched from the package index, a bug is injected, and the
repair is replayed (the replay backend: recorded turns, not a model). The project's environment is
set up from its own files on the first run and reused from the cache on the second, which is asked
for "the failing test" (whatever the bug breaks, found by running the suite).

Also: the environment failures end the run with exit code 4 and one message naming the cause,
before the agent starts, with the user's tree untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.fix.runs import SUMMARY_FILE
from tests.git_repos import git, make_repo
from tests.real_projects import (
    PROJECTS,
    Project,
    drop_image,
    environment_image,
    fetch_sdist,
    inject,
    replay_file,
)

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

FIX_TIMEOUT_S = 1500


def fix(repo: Path, target: str, replay: Path) -> subprocess.CompletedProcess[str]:
    """``clover-agent fix TARGET`` with the defaults (Docker sandbox, suite regression runs), the
    repository's .clover/config.toml (these tests write it) trusted."""
    return subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", target, "--repo", str(repo), "--backend", "replay",
         "--replay", str(replay), "--yes", "--trust-repo"],
        capture_output=True, text=True, timeout=FIX_TIMEOUT_S, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip


def last_run(repo: Path) -> Path:
    runs = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    return sorted(runs, key=lambda p: p.stat().st_mtime)[-1]


def last_summary(repo: Path) -> dict:
    return json.loads((last_run(repo) / SUMMARY_FILE).read_text())


def start_seconds(repo: Path) -> float:
    """How long the last run's sandbox took to start (with the environment's set-up when it is not
    cached): from the set-up phase to the phase after it."""
    events = [json.loads(line) for line in (last_run(repo) / "trajectory.jsonl").read_text().splitlines()]
    phases = [e for e in events if e["type"] == "phase_started"]
    setup = next(n for n, e in enumerate(phases) if e["phase"] == "set-up")
    return phases[setup + 1]["time"] - phases[setup]["time"]


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_fix_repairs_a_real_project_and_the_second_run_starts_from_the_cached_environment(
    project: Project, tmp_path: Path
) -> None:
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    original = (repo / project.path).read_text()
    tag = environment_image(repo)
    drop_image(tag)  # made by an earlier run of this test: this one sets the project up itself
    starts: dict[str, float] = {}
    try:
        for attempt in ("cold", "warm"):
            inject(repo, project)
            # the second time as a user who does not know which test: whatever the bug breaks
            target = project.target if attempt == "cold" else "the failing test"
            proc = fix(repo, target, replay_file(tmp_path / f"{attempt}.jsonl", project))
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, out[-6000:]
            assert "FIXED" in proc.stdout
            if attempt == "cold":
                assert "sandbox: environment: setting the project up" in out, out[-3000:]
                assert "sandbox: environment: pip install the project (editable" in out
                for found in project.says:
                    assert found in out, out[-3000:]
            else:
                assert f"sandbox: environment: cached ({tag})" in out, out[-3000:]
                assert "setting the project up" not in out
                summary = last_summary(repo)
                assert summary["mode"] == "failing tests" and summary["verdict"] == "fixed"
                outcomes = summary["tests"]["suite_before"]["outcomes"]
                failing = [t for t, o in outcomes.items() if o in ("failed", "error")]
                assert summary["tests"]["target_before"]["failed"] == len(failing) >= 1
                if "::" in project.target:  # the test the bug is known to break, among those chosen
                    assert project.target in failing, failing
                said = f"the {len(failing)} test(s) failing in the suite ('the failing test' names the tests failing now)"
                assert said in proc.stdout, proc.stdout[-3000:]
            # the patch is applied: the file is as released again, and nothing else changed
            assert (repo / project.path).read_text() == original
            assert git(repo, "status", "--porcelain") == f" M {project.path}\n"
            summary = last_summary(repo)
            after = summary["tests"]["suite_after"]
            assert after["failed"] == 0 and after["errors"] == 0 and after["passed"] > 50, after
            assert summary["tests"]["target_before"]["failed"] >= 1
            starts[attempt] = start_seconds(repo)
        # the set-up is not repeated (bench/env_bench.py measures by how much)
        assert starts["warm"] < starts["cold"], starts
    finally:
        drop_image(tag)


def tree(root: Path) -> dict[str, bytes]:
    """The user's files (the run records under .clover/runs left out)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".clover/runs" not in p.as_posix()
    }


def demo(
    root: Path,
    *,
    dependency: str = "text-unidecode==1.3",
    config: str = "",
    test_import: str = "text_unidecode",
) -> Path:
    return make_repo(
        root,
        {
            "pyproject.toml": f'[project]\nname = "demo-{root.name}"\nversion = "0.1"\ndependencies = ["{dependency}"]\n'
            '[tool.setuptools]\npy-modules = ["demo"]\n',
            "demo.py": "def add(a, b):\n    return a - b\n",
            "tests/test_demo.py": f"import {test_import}\nfrom demo import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
            **({".clover/config.toml": config} if config else {}),
        },
    )


def unused_replay(path: Path) -> Path:
    """A replay that would change the code and finish, were the agent started."""
    turn = (
        "<tool_call>\n<function=editor>\n<parameter=command>\ncreate\n</parameter>\n<parameter=path>\n"
        "/workspace/demo.py\n</parameter>\n<parameter=file_text>\nx = 1\n</parameter>\n</function>\n</tool_call>"
    )
    path.write_text(json.dumps({"content": turn}) + "\n")
    return path


def assert_stopped_before_the_agent(repo: Path, proc: subprocess.CompletedProcess[str], before: dict) -> str:
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback (most recent call last)" not in proc.stderr
    assert tree(repo) == before  # nothing lost, nothing changed
    (run,) = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    events = [json.loads(line)["type"] for line in (run / "trajectory.jsonl").read_text().splitlines()]
    assert "run_started" not in events and "model_responded" not in events  # the agent never started
    assert events[-1] == "task_finished"
    return proc.stderr


def test_a_dependency_that_cannot_be_installed(tmp_path: Path) -> None:
    repo = demo(tmp_path / "nodep", dependency="clover-agent-no-such-package-xyz==1.0")
    before = tree(repo)
    err = assert_stopped_before_the_agent(
        repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
    )
    assert "the environment set-up failed at step 1 of 1" in err
    assert "clover-agent-no-such-package-xyz" in err and "A requirement is not available" in err


def test_a_setup_command_that_fails(tmp_path: Path) -> None:
    repo = demo(tmp_path / "badsetup", config='[sandbox]\nsetup = ["echo generating the parser; exit 3"]\n')
    before = tree(repo)
    err = assert_stopped_before_the_agent(
        repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
    )
    assert "run echo generating the parser; exit 3 (exit code 3)" in err and "generating the parser" in err


def test_a_collection_error_before_any_change(tmp_path: Path) -> None:
    repo = demo(tmp_path / "collect", test_import="yaml_not_installed_anywhere")
    before = tree(repo)
    try:
        err = assert_stopped_before_the_agent(
            repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
        )
    finally:
        drop_image(environment_image(repo))
    assert (
        "cannot run in the sandbox's environment: the module 'yaml_not_installed_anywhere' is not installed"
        in err
    )
    assert "No module named 'yaml_not_installed_anywhere'" in err  # the output that shows it
    assert "To fix the set-up" in err and "the agent was not started" in err


def test_a_module_of_an_extra_the_set_up_did_not_install_is_named_with_the_line_to_add(
    tmp_path: Path,
) -> None:
    """pydantic-extra-types 2.9.0 with the extras chosen in .clover/config.toml (so the set-up adds
    none): its ULID tests need the extra python_ulid, and the message says which line installs it."""
    repo = fetch_sdist("pydantic-extra-types", "2.9.0", tmp_path / "src")
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nextras = ["phonenumbers"]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "choose the extras")
    before = tree(repo)
    try:
        err = assert_stopped_before_the_agent(
            repo, fix(repo, "tests/test_ulid.py", unused_replay(tmp_path / "unused.jsonl")), before
        )
    finally:
        drop_image(environment_image(repo))
    assert "the module 'ulid' is not installed (No module named 'ulid')" in err, err[-3000:]
    assert "the project's extra 'python_ulid' lists python-ulid, which provides it" in err
    assert 'extras = ["phonenumbers", "python_ulid"]' in err
