"""Running ``clover-agent ci`` as a CI job does (its own process, stdout and stderr apart) and
checking everything it leaves: the exit code, the files, the schemas, the JSON Lines events, and
that the working tree is as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from clover_agent.agent.trajectory import read_events
from clover_agent.ci.events import VERSIONS, events_validator
from clover_agent.ci.result import result_schema
from tests.git_repos import git

STATUS = {0: "fixed", 1: "not_fixed", 2: "usage_error", 3: "backend_unavailable", 4: "sandbox_unavailable",
          5: "nothing_to_fix", 6: "budget_exhausted", 8: "fixed_suite_unverified", 9: "needs_review",
          10: "blocked", 130: "interrupted"}  # fmt: skip


@dataclass
class CiRun:
    code: int
    stdout: str
    stderr: str
    out: Path
    result: dict[str, Any] | None
    events: list[dict[str, Any]]

    @property
    def summary(self) -> str:
        return (self.out / "summary.md").read_text()

    @property
    def patch(self) -> str:
        return (self.out / "patch.diff").read_text()

    def outputs_text(self) -> str:
        """Everything the run wrote or printed, as one text (for secrets that must not be there)."""
        files = (
            [p.read_text(errors="replace") for p in sorted(self.out.iterdir())] if self.out.is_dir() else []
        )
        return "\n".join([self.stdout, self.stderr, *files])


def tree_state(repo: Path, out: Path) -> tuple[str, str, dict[str, bytes]]:
    """HEAD, ``git status`` and the bytes of every file (ignored ones too) outside .git and the
    output folder: what "untouched" compares."""
    files = {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts and out not in p.parents
    }
    return git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"), files


def ci_command(repo: Path, out: Path, *args: str, json_events: bool = True) -> list[str]:
    """``python -m clover_agent ci --repo REPO --output-dir OUT ARGS [--json-events]``."""
    command = [
        sys.executable,
        "-m",
        "clover_agent",
        "ci",
        "--repo",
        str(repo),
        "--output-dir",
        str(out),
        *args,
    ]
    return command + (["--json-events"] if json_events else [])


def run_ci(
    repo: Path,
    out: Path,
    *args: str,
    env: dict[str, str] | None = None,
    json_events: bool = True,
    timeout: float = 600,
) -> CiRun:
    """Run ``clover-agent ci`` (:func:`ci_command`) to its end and :func:`collect` what it left."""
    before = tree_state(repo, out) if (repo / ".git").exists() else None
    proc = subprocess.run(
        ci_command(repo, out, *args, json_events=json_events),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    return collect(proc.returncode, proc.stdout, proc.stderr, repo, out, before, json_events=json_events)


def collect(
    code: int,
    stdout: str,
    stderr: str,
    repo: Path,
    out: Path,
    before: tuple[str, str, dict[str, bytes]] | None,
    *,
    json_events: bool = True,
) -> CiRun:
    """What holds for every run: no traceback, the tree as ``before``, result.json and every event
    line valid against their schemas, the last event ``finished`` with result.json's content."""
    assert "Traceback" not in stderr, stderr
    if before is not None:
        assert tree_state(repo, out) == before, "the working tree changed"
    result = None
    if (out / "result.json").exists():
        result = json.loads((out / "result.json").read_text())
        jsonschema.validate(result, result_schema())
        assert result["exit_code"] == code and result["status"] == STATUS[code]
        assert (out / "summary.md").read_text().startswith("### clover-agent ci: ")
        assert (out / "patch.diff").exists()
        # Only the bot's own files: not the workflow's summary.json or shadow repository.
        assert {p.name for p in out.iterdir()} <= {
            "patch.diff",
            "result.json",
            "summary.md",
            "trajectory.jsonl",
        }
    events = []
    if json_events:
        validators = {v: events_validator(v) for v in VERSIONS}  # finished.result: result.schema.json's
        events = [json.loads(line) for line in stdout.splitlines()]  # stdout holds events only
        for event in events:
            validators[event["v"]].validate(event)
        assert len({event["v"] for event in events}) == 1  # one version a run
        assert events and events[-1]["type"] == "finished" and events[-1]["exit_code"] == code
        assert [e["type"] for e in events].count("finished") == 1
        if result is not None:
            assert events[-1]["result"] == result
    return CiRun(code, stdout, stderr, out, result, events)


def check_trajectory(run: CiRun) -> list[Any]:
    """The trajectory's events; its last one is the task's verdict, ``command`` ci."""
    events = read_events(run.out / "trajectory.jsonl")
    assert events[0].type == "task_started" and events[0].command == "ci"
    assert events[-1].type == "task_finished" and events[-1].command == "ci"
    return events


def patch_applies(repo: Path, run: CiRun) -> bool:
    """Whether patch.diff applies to the starting commit with the command result.json names."""
    check = subprocess.run(
        ["git", "-C", str(repo), "apply", "--check", str(run.out / "patch.diff")],
        capture_output=True,
        text=True,
    )
    return (
        check.returncode == 0
        and run.result is not None
        and run.result["patch"]["apply"] == "git apply patch.diff"
    )
