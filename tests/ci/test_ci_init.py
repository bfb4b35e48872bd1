"""``clover-agent ci init``: the workflows written into a real repository with the action pinned to a
full commit SHA and the CI workflow named, checked by actionlint and zizmor (the dev extra's) with
no findings; what would weaken them refused (a tag or branch for the action, an odd workflow name,
an unpinned action), nothing replaced without --force, nothing written with --dry-run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from clover_agent.ci.init import check_pins, workflows
from clover_agent.cli import main
from clover_agent.errors import CloverError, ExitCode

SHA = "7c9f5228c6d1c2b5a1a0a6d0e0a1b2c3d4e5f6a7"
ACTION = f"my-org/clover-agent@{SHA}"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def test_init_writes_pinned_workflows_that_actionlint_and_zizmor_pass(tmp_path: Path, capsys) -> None:
    repo = _repo(tmp_path)
    code = main(["ci", "init", "--repo", str(repo), "--action", ACTION, "--ci-workflow", "Unit tests"])
    out = capsys.readouterr().out
    assert code == 0, out
    written = sorted(p.name for p in (repo / ".github" / "workflows").iterdir())
    assert written == ["clover-ci-failure.yml", "clover.yml"]
    for name in written:
        text = (repo / ".github" / "workflows" / name).read_text()
        assert "CLOVER_AGENT_COMMIT" not in text and f"uses: {ACTION}" in text
        yaml.safe_load(text)
    failure = yaml.safe_load((repo / ".github" / "workflows" / "clover-ci-failure.yml").read_text())
    assert failure[True]["workflow_run"]["workflows"] == ["Unit tests"]  # `on:` reads as True in YAML 1.1
    assert "checked with actionlint and zizmor: no findings" in out
    assert "CLOVER_BASE_URL" in out and "CLOVER_API_KEY" in out  # what to set next is named

    # the same again: nothing differs, nothing to force
    assert main(["ci", "init", "--repo", str(repo), "--action", ACTION, "--ci-workflow", "Unit tests"]) == 0


@pytest.mark.parametrize(
    "action",
    [
        "my-org/clover-agent@v1",
        "my-org/clover-agent@main",
        "my-org/clover-agent@7c9f522",
        "clover-agent@" + SHA,
    ],
)
def test_an_action_not_pinned_to_a_full_sha_is_refused(tmp_path: Path, capsys, action: str) -> None:
    repo = _repo(tmp_path)
    assert main(["ci", "init", "--repo", str(repo), "--action", action]) == ExitCode.USAGE
    assert "full SHA" in capsys.readouterr().err
    assert not (repo / ".github").exists()


def test_a_workflow_name_that_would_change_the_yaml_is_refused(tmp_path: Path, capsys) -> None:
    repo = _repo(tmp_path)
    code = main(
        ["ci", "init", "--repo", str(repo), "--action", ACTION, "--ci-workflow", "CI]\n    types: [x"]
    )
    assert code == ExitCode.USAGE and "--ci-workflow" in capsys.readouterr().err
    assert not (repo / ".github").exists()


def test_nothing_is_replaced_without_force_and_dry_run_writes_nothing(tmp_path: Path, capsys) -> None:
    repo = _repo(tmp_path)
    mine = repo / ".github" / "workflows" / "clover.yml"
    mine.parent.mkdir(parents=True)
    mine.write_text("name: mine\n")
    assert main(["ci", "init", "--repo", str(repo), "--action", ACTION]) == ExitCode.USAGE
    assert "--force" in capsys.readouterr().err and mine.read_text() == "name: mine\n"

    assert main(["ci", "init", "--repo", str(repo), "--action", ACTION, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not written: --dry-run" in out and f"uses: {ACTION}" in out and "no findings" in out
    assert mine.read_text() == "name: mine\n" and not (mine.parent / "clover-ci-failure.yml").exists()

    assert main(["ci", "init", "--repo", str(repo), "--action", ACTION, "--force"]) == 0
    assert f"uses: {ACTION}" in mine.read_text()


def test_the_pin_check_can_fail() -> None:
    text = workflows(ACTION)["clover.yml"]
    check_pins(text)
    with pytest.raises(CloverError, match="not pinned"):
        check_pins(text.replace(f"uses: {ACTION}", "uses: my-org/clover-agent@v1"))


@pytest.mark.parametrize("link", [".github", ".github/workflows", ".github/workflows/clover.yml"])
def test_a_symlink_on_the_way_is_refused_and_nothing_outside_is_written(
    tmp_path: Path, capsys, link: str
) -> None:
    """A repository may bring a symlink where the workflows go (to a file of the user's, say):
    even with --force nothing is written through it."""
    repo = _repo(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "clover.yml").write_text("mine\n")
    (outside / "workflows").mkdir()
    target = {
        ".github": outside,
        ".github/workflows": outside,
        ".github/workflows/clover.yml": outside / "clover.yml",
    }
    (repo / link).parent.mkdir(parents=True, exist_ok=True)
    (repo / link).symlink_to(target[link])
    code = main(["ci", "init", "--repo", str(repo), "--action", ACTION, "--force"])
    assert code == ExitCode.USAGE and "is a symlink" in capsys.readouterr().err
    assert (outside / "clover.yml").read_text() == "mine\n"
    assert sorted(p.name for p in outside.iterdir()) == ["clover.yml", "workflows"]
    assert list((outside / "workflows").iterdir()) == []
