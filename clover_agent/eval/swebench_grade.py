"""``--grade swebench``: the patches graded by SWE-bench's own harness, as a leaderboard grades them.

The task lines go to ``swebench.harness.run_evaluation`` (the ``swebench`` package, 4.x) as
SWE-bench's dataset lines: the package's own spec functions make each instance's image name, eval
script and test command from its ``repo`` and ``version``, its log parser reads the tests' output
(django's ``runtests.py``, sympy's ``bin/test``, pytest...); nothing here re-derives them. The
instance images are pulled from a namespace (``swebench``, as SWE-bench publishes them) or built
by the package (namespace ``none``). Its per-instance ``report.json`` files are read back into
ours. The package is optional (``pip install 'swebench>=4.1,<5'``): only this grader needs it.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_agent.errors import UsageError
from clover_agent.eval.tasks import Task

FOLDER = "swebench"  # under OUT: the lines, the predictions, swebench's logs and its run report
RUN_ID = "clover-eval"
DATASET_FILE = "dataset.jsonl"
PREDICTIONS_FILE = "predictions.jsonl"
LOG_FILE = "run_evaluation.log"
GRADERS = ("ours", "swebench")
#: Where the instance images come from: SWE-bench's published ones (Docker Hub's ``swebench``).
DEFAULT_NAMESPACE = "swebench"


@dataclass(frozen=True)
class SwebenchGrade:
    """One instance as swebench's harness graded it."""

    resolved: bool
    status: str  # "resolved" | "unresolved" | "empty patch" | "error"
    message: str
    tests: dict[str, Any] | None = None  # swebench's tests_status: FAIL_TO_PASS/PASS_TO_PASS
    log: str = ""  # the instance's run_instance.log, relative to OUT

    def to_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "status": self.status,
            "message": self.message,
            "tests": self.tests,
            "log": self.log,
        }


def check_tasks(tasks: list[Task], namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """Every task can be graded by swebench: the package (4.x) is importable and has a spec for
    each line's ``repo`` and ``version``. Returns each task's instance image, as swebench names it."""
    try:
        from swebench.harness.test_spec.test_spec import make_test_spec
    except ImportError as exc:
        raise UsageError(
            f"--grade swebench needs the swebench package (4.x), which is not importable here ({exc}): "
            "`pip install 'swebench>=4.1,<5'`"
        ) from None
    images = {}
    for task in tasks:
        line = instance_line(task)
        try:
            spec = make_test_spec(line, namespace=_namespace(namespace))
        except KeyError:
            raise UsageError(
                f"{task.origin}: swebench has no spec for repo {line['repo']!r} version "
                f"{line.get('version', '')!r}: its harness cannot grade this task (--grade ours can)"
            ) from None
        images[task.instance_id] = spec.instance_image_key
    return images


def instance_line(task: Task) -> dict[str, Any]:
    """The task as swebench's harness reads a dataset line: SWE-bench's fields as given."""
    missing = [key for key in ("repo", "version", "base_commit") if not task.swebench.get(key)]
    if missing:
        raise UsageError(
            f"{task.origin}: --grade swebench needs the instance's {', '.join(missing)} (a SWE-bench "
            'line: repo "owner/name", version, base_commit); use --grade ours for other tasks'
        )
    return task.to_instance()


def _namespace(namespace: str) -> str | None:
    """swebench's spelling: ``none`` is no namespace (its images built locally)."""
    return None if namespace.lower() == "none" else namespace


def grade_with_swebench(
    tasks: list[Task],
    results: list[dict[str, Any]],
    out: Path,
    *,
    workers: int = 1,
    timeout_s: int = 1800,
    namespace: str = DEFAULT_NAMESPACE,
) -> dict[str, SwebenchGrade]:
    """Runs swebench's harness over the results' patches (a task that could not be run is left
    out) and reads its reports; an instance it reports nothing for is an ``error`` that names its
    log. swebench keeps each instance's report, so a second eval over ``out`` grades only what is
    new or whose patch changed."""
    folder = out / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    by_id = {r["instance_id"]: r for r in results if not r.get("error")}
    graded = [t for t in tasks if t.instance_id in by_id]
    if not graded:
        return {}
    _write_lines(folder / DATASET_FILE, [instance_line(t) for t in graded])
    predictions = [_prediction(by_id[t.instance_id]) for t in graded]
    _write_lines(folder / PREDICTIONS_FILE, predictions)
    for pred in predictions:
        _forget_if_changed(folder, pred)
    command = [
        sys.executable, "-m", "swebench.harness.run_evaluation",
        "--dataset_name", str((folder / DATASET_FILE).resolve()),
        "--predictions_path", str((folder / PREDICTIONS_FILE).resolve()),
        "--run_id", RUN_ID,
        "--max_workers", str(workers),
        "--timeout", str(timeout_s),
        "--namespace", namespace,
        "--open_file_limit", str(open_file_limit()),
        "--report_dir", ".",
    ]  # fmt: skip
    with open(folder / LOG_FILE, "wb") as log:
        proc = subprocess.run(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, check=False)
    grades = {pred["instance_id"]: _read_grade(folder, out, pred) for pred in predictions}
    if proc.returncode != 0:
        why = f"swebench's run_evaluation exited {proc.returncode}: see {folder / LOG_FILE}"
        grades = {
            key: g if g.status != "error" else SwebenchGrade(False, "error", f"{why}; {g.message}", log=g.log)
            for key, g in grades.items()
        }
    return grades


def _prediction(result: dict[str, Any]) -> dict[str, str]:
    return {
        "instance_id": result["instance_id"],
        "model_name_or_path": result.get("model_name_or_path") or "clover-agent",
        "model_patch": result.get("model_patch") or "",
    }


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def _instance_dir(folder: Path, pred: dict[str, str]) -> Path:
    """Where swebench keeps an instance's logs and report (its own layout)."""
    model = pred["model_name_or_path"].replace("/", "__")
    return folder / "logs" / "run_evaluation" / RUN_ID / model / pred["instance_id"]


def _forget_if_changed(folder: Path, pred: dict[str, str]) -> None:
    """swebench reuses an instance's report whatever the patch is now: one graded from another
    patch is removed, so that instance is graded again."""
    kept = _instance_dir(folder, pred)
    patch = kept / "patch.diff"
    if kept.is_dir() and (not patch.is_file() or patch.read_text(errors="replace") != pred["model_patch"]):
        shutil.rmtree(kept)


def _read_grade(folder: Path, out: Path, pred: dict[str, str]) -> SwebenchGrade:
    if not pred["model_patch"].strip():
        return SwebenchGrade(False, "empty patch", "no patch: swebench does not run an empty prediction")
    kept = _instance_dir(folder, pred)
    log = str((kept / "run_instance.log").relative_to(out))
    try:
        report = json.loads((kept / "report.json").read_text(encoding="utf-8"))[pred["instance_id"]]
    except (OSError, ValueError, KeyError, TypeError):
        from swebench.harness.constants import APPLY_PATCH_FAIL

        if APPLY_PATCH_FAIL in _text(kept / "run_instance.log"):  # it writes no report then
            return SwebenchGrade(False, "unresolved", "unresolved: the patch does not apply", log=log)
        return SwebenchGrade(False, "error", f"swebench wrote no report for it: see {log}", log=log)
    tests = report.get("tests_status")
    if report.get("resolved"):
        return SwebenchGrade(True, "resolved", "resolved (swebench: RESOLVED_FULL)", tests, log)
    if not report.get("patch_successfully_applied"):
        why = "the tests' output could not be read (see the log)"
        return SwebenchGrade(False, "unresolved", f"unresolved: {why}", tests, log)
    failed = [
        f"{kind}: {name}"
        for kind in ("FAIL_TO_PASS", "PASS_TO_PASS")
        for name in ((tests or {}).get(kind) or {}).get("failure", [])
    ]
    why = "; ".join(failed[:5]) or "see the log"
    return SwebenchGrade(False, "unresolved", f"unresolved: {why}", tests, log)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def open_file_limit() -> int:
    """The limit swebench sets for itself (soft and hard alike): at most this process's hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(soft, 4096)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
