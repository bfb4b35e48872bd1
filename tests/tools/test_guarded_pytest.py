"""The guarded pytest run (``run_tests_in(..., guarded=True)``): the workspace cannot shadow pytest or
its plugins, and a report rewritten after the tests ran is not a pass. Real pytest in real
sandboxes (local; Docker when there); the same project run plainly shows each attack works there."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.sandboxes import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tools.run_tests.guarded import cross_check, live_outcomes
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

FAILING = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n",
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
}
#: Rewrites the JUnit report at exit to say every test passed.
REWRITE = (
    "\nimport atexit, re, sys\n"
    "def _rewrite():\n"
    "    for arg in sys.argv:\n"
    "        if arg.startswith('--junitxml='):\n"
    "            path = arg.split('=', 1)[1]\n"
    "            text = re.sub(r'<failure.*?</failure>', '', open(path).read(), flags=re.S)\n"
    "            open(path, 'w').write(text)\n"
    "atexit.register(_rewrite)\n"
)
FAKE_PYTEST = (
    "import sys\n"
    "for arg in sys.argv:\n"
    "    if arg.startswith('--junitxml='):\n"
    "        open(arg.split('=', 1)[1], 'w').write('<testsuites><testsuite><testcase classname=\"tests.test_calc\" '\n"
    '            \'name="test_add" file="tests/test_calc.py"/></testsuite></testsuites>\')\n'
)
#: A plugin registered by package metadata planted in the workspace.
PLANTED = {
    "evil_plugin.py": "import calc\ncalc.add = lambda a, b: a + b\n",
    "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
}

KINDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


async def both_runs(tmp_path: Path, kind: str, files: dict[str, str]) -> tuple[TestReport, TestReport]:
    repo = make_repo(tmp_path / "repo", files)
    async with create_sandbox(kind, sandbox_spec(repo)) as sandbox:
        plain = await run_tests_in(sandbox, "tests/test_calc.py")
        guarded = await run_tests_in(sandbox, "tests/test_calc.py", guarded=True)
    return plain, guarded


@pytest.mark.parametrize("kind", KINDS)
async def test_a_report_rewritten_at_exit_by_the_code_under_test_is_not_a_pass(
    tmp_path: Path, kind: str
) -> None:
    files = {**FAILING, "calc.py": FAILING["calc.py"] + REWRITE}
    plain, guarded = await both_runs(tmp_path, kind, files)
    assert plain.outcomes["tests/test_calc.py::test_add"] == "passed"  # the attack works on a plain run
    assert guarded.outcomes == {
        "tests/test_calc.py::test_add": "failed",
        "tests/test_calc.py::test_zero": "passed",
    }
    assert guarded.failed == 1 and guarded.passed == 1 and not guarded.all_passed
    assert "clover-live" not in guarded.output and "assert -1 == 5" in guarded.output


@pytest.mark.parametrize("kind", KINDS)
async def test_a_root_pytest_module_does_not_shadow_pytest(tmp_path: Path, kind: str) -> None:
    plain, guarded = await both_runs(tmp_path, kind, {**FAILING, "pytest.py": FAKE_PYTEST})
    assert plain.outcomes.get("tests/test_calc.py::test_add") == "passed" or plain.problem is not None
    assert guarded.outcomes["tests/test_calc.py::test_add"] == "failed" and guarded.problem is None


async def test_a_plugin_planted_as_package_metadata_is_not_loaded(tmp_path: Path) -> None:
    plain, guarded = await both_runs(tmp_path, "local", {**FAILING, **PLANTED})
    assert plain.outcomes["tests/test_calc.py::test_add"] == "passed"  # autoloaded from the workspace
    assert guarded.outcomes["tests/test_calc.py::test_add"] == "failed"


async def test_an_honest_project_gets_the_same_results_both_ways(tmp_path: Path) -> None:
    files = {
        **FAILING,
        "calc.py": "def add(a, b):\n    return a + b\n",
        "tests/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
        "tests/test_more.py": "import pytest\nfrom calc import add\n\n\ndef test_two(two):\n    assert add(two, two) == 4\n\n\n"
        "@pytest.mark.skip(reason='later')\ndef test_later():\n    pass\n\n\n"
        "@pytest.mark.xfail(strict=True)\ndef test_known_bad():\n    assert add(1, 1) == 3\n\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_param(n):\n    assert add(n, 0) == n\n",
    }
    repo = make_repo(tmp_path / "repo", files)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        plain = await run_tests_in(sandbox, None)
        guarded = await run_tests_in(sandbox, None, guarded=True)
    assert plain.outcomes == guarded.outcomes and guarded.all_passed
    assert (guarded.passed, guarded.skipped) == (plain.passed, plain.skipped) == (5, 2)


def test_the_live_stream_counts_only_its_own_secret_and_the_first_report() -> None:
    line = '\x1eclover-live {n} {{"id": "t.py::{t}", "when": "{w}", "outcome": "{o}", "xfail": {x}}}\n'
    output = "".join(
        [
            line.format(n="s3cret", t="a", w="call", o="failed", x="false"),
            line.format(n="s3cret", t="a", w="call", o="passed", x="false"),  # a second report: ignored
            line.format(n="forged", t="b", w="call", o="passed", x="false"),  # not this run's secret
            line.format(n="s3cret", t="b", w="call", o="failed", x="false"),
            line.format(n="s3cret", t="c", w="setup", o="skipped", x="true"),  # xfail: skipped
            line.format(n="s3cret", t="d", w="setup", o="passed", x="false"),
            line.format(n="s3cret", t="d", w="teardown", o="failed", x="false"),  # an error
            "noise " + line.format(n="s3cret", t="e", w="call", o="passed", x="false"),
        ]
    )
    assert live_outcomes(output, "s3cret") == {
        "t.py::a": "failed",
        "t.py::b": "failed",
        "t.py::c": "skipped",
        "t.py::d": "error",
        "t.py::e": "passed",
    }
    report = TestReport(
        framework="pytest",
        command="",
        target=None,
        exit_code=0,
        passed=3,
        outcomes={"t.py::a": "passed", "t.py::e": "passed", "t.py::gone": "passed"},
    )
    changed = cross_check(report, {"t.py::a": "failed", "t.py::e": "passed", "t.py::new": "error"})
    assert sorted(changed) == ["t.py::a", "t.py::gone", "t.py::new"]
    assert report.outcomes == {
        "t.py::a": "failed",
        "t.py::e": "passed",
        "t.py::gone": "error",
        "t.py::new": "error",
    }
    assert (report.passed, report.failed, report.errors) == (1, 1, 2)
