"""Grading like SWE-bench: in a fresh sandbox over the task's repository as released, the model's
patch is applied, then the held-out test patch over it (the test patch's files as the task has
them, whatever the model did to them); every FAIL_TO_PASS test must pass and no PASS_TO_PASS test
may fail. Nothing of the fix run is reused but its patch."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.errors import RUN_ERRORS, message_of
from clover_agent.eval.scripts import parse_patch
from clover_agent.eval.tasks import Task
from clover_agent.handback.hostgit import git
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in

GRADE_TIMEOUT_S = 900.0


@dataclass
class Grade:
    resolved: bool
    message: str
    fail_to_pass: dict[str, str] = field(default_factory=dict)  # test id -> outcome ("missing": not run)
    pass_to_pass_failed: list[str] = field(default_factory=list)
    patch_applied: bool = True
    #: What a grader adds (a SWE-bench instance's: swebench's report, the log, the files left out).
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "message": self.message,
            "patch_applied": self.patch_applied,
            "FAIL_TO_PASS": self.fail_to_pass,
            "PASS_TO_PASS_failed": self.pass_to_pass_failed,
            **self.details,
        }


def test_patch_paths(task: Task) -> list[str]:
    return sorted({name for d in parse_patch(task.test_patch) for name in (d.old, d.new) if name})


def prepare_tree(
    base: Path, dest: Path, task: Task, model_patch: str, exclude: list[str] | None = None
) -> str | None:
    """``dest``: a copy of ``base`` with ``model_patch`` (its changes to the test patch's files and
    to ``exclude`` left out: they are taken as they are) and the test patch applied. Returns why
    the model's patch did not apply, or None."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, symlinks=True)
    if model_patch.strip():
        excluded = [f"--exclude={path}" for path in sorted({*test_patch_paths(task), *(exclude or [])})]
        applied = git(
            dest, "apply", "--whitespace=nowarn", *excluded, "-", input=model_patch.encode(), check=False
        )
        if applied.returncode != 0:
            return applied.stderr.decode("utf-8", "replace").strip() or "git apply failed"
    git(dest, "apply", "--whitespace=nowarn", "-", input=task.test_patch.encode())
    return None


def outcomes_of(report: TestReport, test_id: str) -> list[str]:
    """The outcomes of the tests ``test_id`` names: itself, its parametrized cases, or (a file or
    a class) every test under it."""
    return [
        outcome
        for name, outcome in report.outcomes.items()
        if name == test_id or name.startswith((test_id + "[", test_id + "::"))
    ]


async def grade(
    task: Task, base: Path, work: Path, model_patch: str, make_spec: Callable[[Path], SandboxSpec], kind: str
) -> Grade:
    """Grade ``model_patch`` for ``task`` over the released tree ``base`` (``work``: a scratch
    folder the graded tree is made in; ``make_spec``: the spec of a sandbox over a folder)."""
    problem = prepare_tree(base, work, task, model_patch)
    if problem is not None:
        return Grade(False, f"the patch does not apply: {problem}", patch_applied=False)
    try:
        async with create_sandbox(kind, make_spec(work)) as sandbox:
            target = await run_tests_in(
                sandbox, " ".join(task.fail_to_pass), timeout=GRADE_TIMEOUT_S, guarded=True
            )
            f2p = {}
            for test_id in task.fail_to_pass:
                seen = outcomes_of(target, test_id)
                f2p[test_id] = "missing" if not seen else next((o for o in seen if o != "passed"), "passed")
            p2p_failed: list[str] = []
            if task.pass_to_pass:
                rest = await run_tests_in(
                    sandbox, " ".join(task.pass_to_pass), timeout=GRADE_TIMEOUT_S, guarded=True
                )
                for test_id in task.pass_to_pass:
                    seen = outcomes_of(rest, test_id)
                    if not seen or any(o in ("failed", "error") for o in seen):
                        p2p_failed.append(test_id)
    except RUN_ERRORS as exc:
        return Grade(False, f"the grading sandbox failed: {message_of(exc)}")
    failing = [t for t, o in f2p.items() if o != "passed"]
    if failing:
        shown = ", ".join(f"{t} ({f2p[t]})" for t in failing[:5])
        return Grade(False, f"FAIL_TO_PASS not passing: {shown}", f2p, p2p_failed)
    if p2p_failed:
        return Grade(False, f"PASS_TO_PASS broken: {', '.join(p2p_failed[:5])}", f2p, p2p_failed)
    return Grade(
        True, "resolved: every FAIL_TO_PASS test passes, no PASS_TO_PASS test fails", f2p, p2p_failed
    )
