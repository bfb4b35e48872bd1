"""Narrowing the regression run: which test files are related to the target (in a real local
sandbox over a real repository)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.errors import ExitCode
from clover_agent.fix.regression import select_regression
from clover_agent.fix.runs import SUMMARY_FILE
from clover_agent.handback.verdict import regressions, renamed_cases
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import make_repo

FILES = {
    "pkg/__init__.py": "",
    "pkg/a.py": "def f():\n    return 1\n",
    "pkg/b.py": "def g():\n    return 2\n",
    "tests/__init__.py": "",
    "tests/test_a.py": "import os.path\nimport pkg.a\n\ndef test_f():\n    assert pkg.a.f() == 1\n",
    "tests/test_a_more.py": "from pkg.a import f\n\ndef test_f_again():\n    assert f() == 1\n",
    "tests/sub/test_relative.py": "from ...pkg import a\n\ndef test_rel():\n    assert a.f()\n",
    "tests/test_b.py": "import os.path\nfrom pkg import b\n\ndef test_g():\n    assert b.g() == 2\n",
    "tests/test_os.py": "import os.path\n\ndef test_os():\n    assert os.path.sep\n",
    ".venv/lib/test_vendored.py": "from pkg.a import f\n",
}


@pytest.fixture
async def sandbox(tmp_path: Path):
    repo = make_repo(tmp_path / "r", {k: v for k, v in FILES.items() if not k.startswith(".venv")})
    (repo / ".venv" / "lib").mkdir(parents=True)
    (repo / ".venv" / "lib" / "test_vendored.py").write_text(FILES[".venv/lib/test_vendored.py"])
    async with create_sandbox("local", SandboxSpec(repo=str(repo))) as sb:
        yield sb


async def test_related_tests_share_a_project_module_with_the_target(sandbox) -> None:
    selection = await select_regression(sandbox, "related", ["tests/test_a.py::test_f"])
    assert selection.scope == "related"
    # os.path is shared by test_b and test_os but is not the project's; pkg.a is
    assert selection.files == ("tests/sub/test_relative.py", "tests/test_a.py", "tests/test_a_more.py")
    assert selection.target == "tests/sub/test_relative.py tests/test_a.py tests/test_a_more.py"
    assert selection.describe().startswith("3 related test files")


async def test_suite_none_and_nothing_to_narrow_to(sandbox) -> None:
    assert (await select_regression(sandbox, "suite", ["tests/test_a.py::test_f"])).target is None
    none = await select_regression(sandbox, "none", ["tests/test_a.py::test_f"])
    assert not none.runs and "only the target" in none.describe()
    # a target whose tests are not in files (a unittest id): the whole suite
    assert (await select_regression(sandbox, "related", ["tests.test_a.T.test_f"])).scope == "suite"


def report(outcomes: dict[str, str]) -> TestReport:
    return TestReport(framework="pytest", command="pytest", target=None, exit_code=0, outcomes=outcomes)


def test_cases_whose_parametrize_ids_change_between_runs_are_not_regressions() -> None:
    # marshmallow names cases after datetime.now(): the ids differ between the runs before and after
    before = report(
        {
            "t.py::test_when[14:38:07]": "passed",
            "t.py::test_when[2026 14:38:07]": "passed",
            "t.py::test_other": "passed",
            "t.py::test_kept[1]": "passed",
        }
    )
    after = report({"t.py::test_when[14:41:55]": "passed", "t.py::test_when[2026 14:41:55]": "passed",
                    "t.py::test_other": "passed", "t.py::test_kept[1]": "passed"})  # fmt: skip
    assert renamed_cases(before, after) == {"t.py::test_when[14:38:07]", "t.py::test_when[2026 14:38:07]"}
    assert regressions(before, after) == []


def test_a_deleted_or_failing_case_is_still_a_regression() -> None:
    before = report({"t.py::test_p[a]": "passed", "t.py::test_p[b]": "passed", "t.py::test_q[x]": "passed"})
    fewer = report({"t.py::test_p[a]": "passed", "t.py::test_q[y]": "failed"})
    assert regressions(before, fewer) == ["t.py::test_p[b]", "t.py::test_q[x]"]
    assert renamed_cases(before, fewer) == set()


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["related", "none"])
def test_fix_with_a_narrowed_regression_run(scope: str, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    return 0\n\ndef g():\n    return 2\n",
            "pkg/b.py": "def h():\n    return 3\n",
            "tests/test_a.py": "from pkg.a import f\n\ndef test_f():\n    assert f() == 1\n",
            "tests/test_a_more.py": "from pkg import a\n\ndef test_g():\n    assert a.g() == 2\n",
            "tests/test_b.py": "from pkg.b import h\n\ndef test_h():\n    assert h() == 3\n",
        },
    )
    replay = write_replay(
        tmp_path / "fix.jsonl",
        [
            call(
                "editor",
                command="str_replace",
                path="/workspace/pkg/a.py",
                old_str="return 0",
                new_str="return 1",
            ),
            call("finish", summary="f returns 1 again"),
        ],
    )
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", "tests/test_a.py::test_f", "--repo", str(repo),
         "--backend", "replay", "--replay", str(replay), "--sandbox", "local", "--yes", "--regression", scope],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    (run,) = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert (repo / "pkg" / "a.py").read_text().startswith("def f():\n    return 1\n")  # applied
    if scope == "related":
        assert proc.returncode == 0, out
        assert "regression baseline: 2 related test files (tests/test_a.py, tests/test_a_more.py)" in out
        assert "in the 2 related test file(s) checked (--regression related)" in out
        # test_b.py shares no module of the project with the target: not run
        assert summary["tests"]["suite_before"]["passed"] == 1  # test_g
        assert summary["tests"]["suite_after"]["passed"] == 2
    else:
        assert proc.returncode == ExitCode.SUITE_UNVERIFIED, out
        assert "the rest of the suite was not checked (no regression run (--regression none)" in out
        assert summary["tests"]["suite_after"]["passed"] == 0
