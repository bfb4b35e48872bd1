"""Small tasks for the eval tests: a real project in a folder (a bug, its fix, the test that
shows it), written as task folders with ``repo.path``, so no index is needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

CALC = '''"""A calculator."""


def add(a, b):
    return a + b


def mean(values):
    return sum(values) / (len(values) - 1)
'''
FIXED = CALC.replace("(len(values) - 1)", "len(values)")
TESTS = """from calc import add


def test_add():
    assert add(2, 3) == 5
"""
NEW_TESTS = (
    TESTS.replace("from calc import add", "from calc import add, mean")
    + """

def test_mean():
    assert mean([1, 2, 3]) == 2
"""
)


def diff(path: str, old: str, new: str) -> str:
    """``git diff --no-index`` of one file's two texts, with a/ and b/ paths."""
    root = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    (root / "a").mkdir()
    (root / "b").mkdir()
    (root / "a" / "f").write_text(old)
    (root / "b" / "f").write_text(new)
    out = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", "a/f", "b/f"], cwd=root, capture_output=True, text=True
    ).stdout
    return out.replace("a/f", f"a/{path}").replace("b/f", f"b/{path}")


def write_project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    return root


def write_task(tasks: Path, instance_id: str, project: Path, **extra: object) -> Path:
    """A task folder over ``project`` (its mean() divides by n - 1)."""
    folder = tasks / instance_id
    folder.mkdir(parents=True)
    task = {
        "instance_id": instance_id,
        "repo": {"path": str(project)},
        "problem_statement": "mean([1, 2, 3]) returns 3.0 instead of 2.0.",
        "FAIL_TO_PASS": ["tests/test_calc.py::test_mean"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_add"],
        "source": {"bug_in": "made for the tests"},
        **extra,
    }
    (folder / "task.json").write_text(json.dumps(task))
    (folder / "test.patch").write_text(diff("tests/test_calc.py", TESTS, NEW_TESTS))
    (folder / "gold.patch").write_text(diff("calc.py", CALC, FIXED))
    return folder
