"""Git sources that clone: a task's ``{"git": URL, "commit": REV}`` and a SWE-bench line's
``repo`` + ``base_commit`` fetch that commit (real git, real repositories made here), through a
mirror folder for a GitHub-shaped repository, once (a second run finds it in the cache); a hostile
URL is refused before git runs; an unreachable host is named as such."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from clover_agent.environments.recipe import PackageIndex
from clover_agent.eval.gitsource import GitFetchOptions, GitSourceError, check_url, fetch
from clover_agent.eval.harness import prepare_repo
from clover_agent.eval.source import SourceError, make_repo
from clover_agent.eval.tasks import RepoSource, load_tasks
from clover_agent.settings import Settings
from tests.eval.tasks_fixture import CALC, FIXED, NEW_TESTS, TESTS, diff
from tests.git_repos import git
from tests.git_repos import make_repo as make_git_repo

INDEX = PackageIndex()


def upstream(root: Path) -> tuple[Path, str, str]:
    """A bare repository with two commits: the bug (returned first) and the fix (the tip)."""
    work = make_git_repo(
        root / "work",
        {
            "calc.py": CALC,
            "tests/test_calc.py": TESTS,
            "pytest.ini": "[pytest]\npythonpath = .\n",
            # names a filter and LFS: neither may run, nothing is configured for them
            ".gitattributes": "*.dat filter=lfs diff=lfs merge=lfs\n",
            "data.dat": "plain bytes\n",
        },
    )
    bug = git(work, "rev-parse", "HEAD").strip()
    (work / "calc.py").write_text(FIXED)
    git(work, "commit", "-qam", "fix mean")
    tip = git(work, "rev-parse", "HEAD").strip()
    bare = root / "bare.git"
    git(root, "clone", "-q", "--bare", str(work), str(bare))
    return bare, bug, tip


def options(tmp_path: Path, mirror: Path | None = None) -> GitFetchOptions:
    return GitFetchOptions(cache=tmp_path / "cache", mirror=mirror, timeout_s=120)


def test_a_git_source_is_fetched_at_its_commit_not_the_tip_and_cached(tmp_path: Path) -> None:
    bare, bug, tip = upstream(tmp_path / "up")
    for number, url in enumerate((str(bare), f"file://{bare}")):
        dest = make_repo(RepoSource("git", url, bug), tmp_path / f"repo{number}", INDEX, options(tmp_path))
        assert (dest / "calc.py").read_text() == CALC  # the bug, not the tip's fix
        assert (dest / "data.dat").read_text() == "plain bytes\n"
        assert git(dest, "rev-list", "--count", "HEAD").strip() == "1"  # one commit: as released
    # an abbreviated id is not given by id: the full fetch finds it
    dest = make_repo(
        RepoSource("git", str(bare), bug[:10]), tmp_path / "short", INDEX, options(tmp_path / "c2")
    )
    assert (dest / "calc.py").read_text() == CALC
    # no commit: the default branch's tip
    dest = make_repo(RepoSource("git", str(bare), ""), tmp_path / "head", INDEX, options(tmp_path / "c3"))
    assert (dest / "calc.py").read_text() == FIXED
    # the second time, the cache has it: the upstream gone, it is still made
    shutil.rmtree(bare)
    again = make_repo(RepoSource("git", str(bare), bug), tmp_path / "again", INDEX, options(tmp_path))
    assert (again / "calc.py").read_text() == CALC
    # and a commit the cache never fetched is not made up
    with pytest.raises(SourceError, match="cannot fetch"):
        make_repo(RepoSource("git", str(bare), tip), tmp_path / "tip", INDEX, options(tmp_path))


def mirrored_calc_line(tmp_path: Path, problem: str) -> tuple[Path, dict[str, Any]]:
    """A git mirror folder holding ``octo/calc.git`` (the calculator at its bug), and a SWE-bench line
    for it: the bug's commit, the fix, the new tests, ``problem`` as the statement."""
    bare, bug, _ = upstream(tmp_path / "up")
    mirror = tmp_path / "mirror"
    (mirror / "octo").mkdir(parents=True)
    shutil.move(str(bare), mirror / "octo" / "calc.git")
    line: dict[str, Any] = {
        "repo": "octo/calc",
        "instance_id": "octo__calc-1",
        "base_commit": bug,
        "patch": diff("calc.py", CALC, FIXED),
        "test_patch": diff("tests/test_calc.py", TESTS, NEW_TESTS),
        "problem_statement": problem,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_mean"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
    }
    return mirror, line


def test_a_swebench_line_is_fetched_through_the_mirror_and_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, line = mirrored_calc_line(tmp_path, "mean() is wrong")
    bug = line["base_commit"]
    line |= {
        "version": "1.0",
        "environment_setup_commit": bug,
    }
    (tmp_path / "swe.jsonl").write_text(json.dumps(line) + "\n")
    (task,) = load_tasks(tmp_path / "swe.jsonl")
    assert task.repo.value == "https://github.com/octo/calc.git" and task.unrunnable == ""
    # the mirror and the cache from the settings' environment and home, as `eval` has them
    settings = Settings(
        config_path=tmp_path / "none.toml",
        home=tmp_path / "home",
        environment={"CLOVER_GIT_MIRROR": str(mirror)},
    )
    base, repo = prepare_repo(task, tmp_path / "work", settings)
    assert (base / "calc.py").read_text() == CALC
    assert (repo / "tests" / "test_calc.py").read_text() == NEW_TESTS  # the test patch applied
    assert list((tmp_path / "home" / "git").glob("calc-*.git"))
    # the second time, from the cache: the mirror is gone and the network is never asked
    shutil.rmtree(mirror)
    shutil.rmtree(tmp_path / "work")
    base, _ = prepare_repo(task, tmp_path / "work", settings)
    assert (base / "calc.py").read_text() == CALC
    # a mirror folder without the repository says where it looked
    missing = GitFetchOptions(cache=tmp_path / "other-cache", mirror=mirror)
    with pytest.raises(GitSourceError, match=r"the mirror has no .*mirror/octo/calc.git.*git clone --mirror"):
        fetch(task.repo.value, bug, missing)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("-uhelp", "read as an option"),
        ("--upload-pack=touch MARKER", "read as an option"),
        ("ext::sh -c touch% MARKER", "transport helper"),
        ("fd::3", "transport helper"),
        ("ssh://example.com/x.git", "ssh:// transport is not allowed"),
        ("http://example.com/x.git", "http:// transport is not allowed"),
        ("example.com:x.git", "would be ssh"),
        ("relative/path", "nor an absolute path"),
        ("file:///x\n--upload-pack=y", "control characters"),
    ],
)
def test_a_hostile_url_is_refused_and_nothing_runs(tmp_path: Path, url: str, why: str) -> None:
    marker = tmp_path / "ran"
    url = url.replace("MARKER", str(marker))
    with pytest.raises(GitSourceError, match=why):
        check_url(url)
    with pytest.raises(SourceError, match=why):
        make_repo(RepoSource("git", url, ""), tmp_path / "dest", INDEX, options(tmp_path))
    assert not marker.exists() and not (tmp_path / "dest").exists()
    assert not (tmp_path / "cache").exists()  # refused before any git ran


def test_a_task_file_with_a_hostile_source_skips_that_task(tmp_path: Path) -> None:
    base = {
        "instance_id": "x",
        "problem_statement": "p",
        "FAIL_TO_PASS": ["t.py::t"],
        "test_patch": diff("t.py", "a\n", "b\n"),
        "patch": diff("c.py", "a\n", "b\n"),
    }
    lines = [
        {**base, "repo": {"git": "--upload-pack=touch /tmp/x", "commit": "abc"}},
        {**base, "repo": {"git": "/srv/x.git", "commit": "HEAD:refs/heads/evil"}},
        {**base, "repo": {"git": "/srv/x.git", "commit": "main..other"}},
        {**base, "repo": {"git": "ext::sh -c touch% /tmp/x", "commit": "abc"}},
        {**base, "repo": {"git": "ssh://example.com/x.git", "commit": "abc"}},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    skipped: list[str] = []
    with pytest.raises(Exception, match="no tasks found"):
        load_tasks(tmp_path / "t.jsonl", on_skip=skipped.append)
    assert "repo.git must be a repository URL" in skipped[0]
    assert all("repo.commit must be a revision" in s for s in skipped[1:3])
    assert "t.jsonl:4: repo.git: git source 'ext::sh -c touch% /tmp/x': a transport helper" in skipped[3]
    assert "t.jsonl:5: repo.git: git source 'ssh://example.com/x.git': the ssh:// transport" in skipped[4]


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://127.0.0.1:1/octo/calc.git", "127.0.0.1"),
        ("https://no-such-host.invalid/octo/calc.git", "no-such-host.invalid"),
    ],
)
def test_offline_the_host_and_the_mirror_are_named(tmp_path: Path, url: str, host: str) -> None:
    with pytest.raises(SourceError) as caught:
        make_repo(RepoSource("git", url, "0" * 40), tmp_path / "dest", INDEX, options(tmp_path))
    message = str(caught.value)
    assert f"{host} cannot be reached" in message and "network is unreachable" in message
    assert "--git-mirror DIR" in message and "CLOVER_GIT_MIRROR" in message
    assert not (tmp_path / "dest").exists()


@pytest.mark.slow
def test_eval_gold_resolves_a_swebench_line_from_a_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`clover-agent eval` end to end (``--sandbox local``, the gold replay) on a SWE-bench line
    whose repository is a GitHub-shaped mirror at a commit that is not the tip; a django-shaped
    line in the same file is reported as a task that cannot be run, and a bad line is skipped."""
    from clover_agent.cli import main
    from tests.eval.test_swebench_tasks import DJANGO

    mirror, line = mirrored_calc_line(tmp_path, "mean([1, 2, 3]) returns 3.0 instead of 2.0.")
    tasks = tmp_path / "swe.jsonl"
    tasks.write_text(json.dumps(line) + "\n{broken\n" + json.dumps(DJANGO) + "\n")
    monkeypatch.setenv("CLOVER_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    flags = ["--sandbox", "local", "--gold", "-q", "--git-mirror", str(mirror)]
    assert main(["eval", str(tasks), "--output-dir", str(out), *flags]) == 1  # the django task: an error
    summary = json.loads((out / "report.json").read_text())
    assert summary["resolved_ids"] == ["octo__calc-1"] and summary["disagreements"] == []
    assert summary["errors"] == ["django__django-11099"]
    assert len(summary["skipped"]) == 1 and "swe.jsonl:2: not valid JSON" in summary["skipped"][0]
    by_id = {r["instance_id"]: r for r in summary["results"]}
    assert by_id["octo__calc-1"]["source"]["base_commit"] == line["base_commit"]
    assert "django's test runner" in by_id["django__django-11099"]["error"]
    table = (out / "report.md").read_text()
    assert "Skipped (tasks of the file" in table and "swe.jsonl:2: not valid JSON" in table


@pytest.mark.parametrize("rev", ["HEAD:refs/heads/evil", "--upload-pack=x", "main..other", "a b"])
def test_a_revision_that_is_not_one_is_refused_before_git_runs(tmp_path: Path, rev: str) -> None:
    bare, _, _ = upstream(tmp_path / "up")
    with pytest.raises(GitSourceError, match="is not a revision"):
        fetch(str(bare), rev, options(tmp_path))
    assert not (tmp_path / "cache").exists()
