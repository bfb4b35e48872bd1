"""Find and check a task's FAIL_TO_PASS and PASS_TO_PASS tests on this machine, as SWE-bench does.

For each task folder: the released tree with the test patch, then with the gold patch too; the
test files the test patch touches run with pytest (``--python``, the project's folders on
``PYTHONPATH``). FAIL_TO_PASS: the tests (a parametrized test counts as one) failing before and
passing after; PASS_TO_PASS: those passing both times. ``--write`` puts them in task.json; without
it the script checks that the task's lists hold (exit 1 when not). Usage:
    python bench/derive_tests.py bench/tasks/ID... [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_agent.eval.grade import test_patch_paths  # noqa: E402
from clover_agent.eval.source import make_repo  # noqa: E402
from clover_agent.eval.tasks import load_tasks  # noqa: E402
from clover_agent.handback.hostgit import git  # noqa: E402
from clover_agent.settings import Settings, host_package_index  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "clover-eval-sdists"


def outcomes(python: str, repo: Path, files: list[str]) -> dict[str, str]:
    """Test function id -> passed | failed (failed when any of its cases failed or erred)."""
    xml = repo / ".junit.xml"
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}:{repo}", "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o", "filterwarnings=", "--continue-on-collection-errors", f"--junitxml={xml}",
         "--rootdir", str(repo), *files],
        cwd=repo, env=env, capture_output=True, timeout=900,
    )  # fmt: skip
    if not xml.is_file():
        raise SystemExit(f"{repo}: pytest wrote no report:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    found: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # classname is dotted: the file's module path, then classes
        # (under src/ for a src layout's package, named by its import name)
        paths = [
            (p + "/".join(parts[:cut]) + ".py", cut) for cut in range(len(parts), 0, -1) for p in ("", "src/")
        ]
        path, cut = next(((path, cut) for path, cut in paths if (repo / path).is_file()), ("", 0))
        if not path:
            continue
        node = "::".join([path, *parts[cut:], case.get("name", "").split("[")[0]])
        bad = any(child.tag in ("failure", "error") for child in case)
        skipped = any(child.tag == "skipped" for child in case)
        state = "failed" if bad else "skipped" if skipped else "passed"
        if found.get(node) != "failed":
            found[node] = state if found.get(node) in (None, "skipped") or state == "failed" else found[node]
    return found


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("tasks", nargs="+")
    p.add_argument("--write", action="store_true")
    p.add_argument(
        "--python", default=sys.executable, help="the Python with pytest (and the projects' test deps)"
    )
    args = p.parse_args()
    index = host_package_index(Settings.load().environment)
    status = 0
    for folder in map(Path, args.tasks):
        (task,) = load_tasks(folder)
        base = CACHE / task.repo.value.replace("==", "-")
        if not base.is_dir():
            make_repo(task.repo, base, index)
        with tempfile.TemporaryDirectory() as scratch:
            repo = Path(scratch) / "repo"
            shutil.copytree(base, repo, symlinks=True)
            git(repo, "apply", "-", input=task.test_patch.encode())
            files = [f for f in test_patch_paths(task) if f.endswith(".py") and "conftest" not in f]
            before = outcomes(args.python, repo, files)
            git(repo, "apply", "-", input=task.patch.encode())
            after = outcomes(args.python, repo, files)
        f2p = sorted(t for t, o in after.items() if o == "passed" and before.get(t) == "failed")
        p2p = sorted(t for t, o in after.items() if o == "passed" and before.get(t) == "passed")
        broken = sorted(t for t, o in after.items() if o == "failed")
        print(f"{task.instance_id}: FAIL_TO_PASS {f2p}; PASS_TO_PASS {len(p2p)}; failing after {broken}")
        if args.write:
            data = json.loads((folder / "task.json").read_text())
            data["FAIL_TO_PASS"], data["PASS_TO_PASS"] = f2p, p2p
            (folder / "task.json").write_text(json.dumps(data, indent=2) + "\n")
        elif {t.split("[")[0] for t in task.fail_to_pass} != set(f2p) or not set(task.pass_to_pass) <= set(
            p2p
        ):
            print(f"  {task.instance_id}: the task's lists differ from what was measured")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
