"""run_tests on a real repository with passing, failing, erroring and skipped tests (real pytest runs
in the sandbox), target selection, and framework detection."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.base import ToolContext
from clover_agent.tools.registry import execute
from clover_agent.tools.run_tests import TestReport, detect_framework, parse_go_json, run_tests_in
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

in_module_loop = pytest.mark.asyncio(loop_scope="module")

TEST_MATH = """\
import pytest

from calc import add


def test_pass():
    assert add(1, 2) == 3


def test_fail():
    assert add(1, 2) == 4, "one plus two"


def test_skip():
    pytest.skip("not today")


@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")


def test_fixture_error(broken):
    pass


class TestGroup:
    def test_in_class(self):
        assert True


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides the shared repository: a project whose tests pass, fail, error and skip."""
    return make_repo(
        tmp_path_factory.mktemp("run_tests") / "repo",
        {
            "pyproject.toml": "[tool.pytest.ini_options]\npythonpath = ['.']\n",
            "calc.py": "def add(a, b):\n    return a + b\n",
            "tests/test_math.py": TEST_MATH,
            "tests/test_broken.py": "import not_a_module_anywhere\n\ndef test_never():\n    pass\n",
        },
    )


@in_module_loop
async def test_full_run_structure(sandbox: Sandbox) -> None:
    report = await run_tests_in(sandbox)
    assert report.framework == "pytest" and report.structured and report.problem is None
    assert (report.passed, report.failed, report.errors, report.skipped) == (3, 2, 2, 1)
    assert report.exit_code == 1 and not report.all_passed and report.duration_s > 0
    assert report.outcomes["tests/test_math.py::test_pass"] == "passed"
    assert report.outcomes["tests/test_math.py::TestGroup::test_in_class"] == "passed"
    assert report.outcomes["tests/test_math.py::test_param[1]"] == "passed"
    assert report.outcomes["tests/test_math.py::test_param[2]"] == "failed"
    assert report.outcomes["tests/test_math.py::test_skip"] == "skipped"
    assert report.outcomes["tests/test_math.py::test_fixture_error"] == "error"
    by_id = {f.test_id: f for f in report.failures}
    fail = by_id["tests/test_math.py::test_fail"]
    assert fail.kind == "failed" and "one plus two" in fail.message
    assert "assert add(1, 2) == 4" in fail.traceback
    fixture = by_id["tests/test_math.py::test_fixture_error"]
    assert fixture.kind == "error" and "fixture exploded" in fixture.traceback
    collection = [f for f in report.failures if "test_broken" in f.test_id]
    assert len(collection) == 1 and collection[0].kind == "error"
    assert "not_a_module_anywhere" in collection[0].traceback


@in_module_loop
@pytest.mark.slow
async def test_tool_output_and_targets(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    everything = await execute("run_tests", {}, ctx)
    assert not everything.ok
    assert "pytest: 3 passed, 2 failed, 2 errors, 1 skipped" in everything.output
    assert "FAILED: tests/test_math.py::test_fail" in everything.output
    assert everything.data["report"]["failed"] == 2 and everything.data["report"]["all_passed"] is False

    node = await execute("run_tests", {"target": "tests/test_math.py::test_pass"}, ctx)
    assert node.ok and node.data["report"]["passed"] == 1 and node.data["report"]["total"] == 1
    absolute = await execute("run_tests", {"target": "/workspace/tests/test_math.py::TestGroup"}, ctx)
    assert absolute.ok and list(absolute.data["report"]["outcomes"]) == [
        "tests/test_math.py::TestGroup::test_in_class"
    ]
    two = await run_tests_in(sandbox, "tests/test_math.py::test_pass tests/test_math.py::test_skip")
    assert (two.passed, two.skipped, two.total) == (1, 1, 2)
    file_report = await run_tests_in(sandbox, "tests/test_math.py")
    assert file_report.total == 7 and file_report.errors == 1
    k_expr = await run_tests_in(sandbox, "-k param")
    assert (k_expr.passed, k_expr.failed) == (1, 1) and k_expr.command.endswith("-k param")
    bare = await run_tests_in(sandbox, "test_in_class")  # not a path: used as a -k expression
    assert bare.command.endswith("-k test_in_class")
    assert (bare.passed, bare.errors) == (1, 1)  # the broken module still fails to collect
    nothing = await run_tests_in(sandbox, "-k no_such_test_name")
    assert (nothing.passed, nothing.errors) == (0, 1) and not nothing.all_passed
    missing = await run_tests_in(sandbox, "tests/test_math.py::test_no_such_node")
    assert missing.total == 0 and missing.problem.startswith(
        "pytest stopped with exit code 4 (ERROR: not found: "
    )
    assert "test_no_such_node" in missing.problem  # pytest's complaint, not just "see the output"


@in_module_loop
async def test_runs_leave_the_workspace_clean(sandbox: Sandbox) -> None:
    await run_tests_in(sandbox, "tests/test_math.py::test_pass")
    status = await sandbox.exec("git status --porcelain --ignored", cwd="/workspace")
    assert status.output == ""


async def start(repo: Path, **spec: object) -> Sandbox:
    sb = create_sandbox("local", sandbox_spec(repo, **spec))
    await sb.start()
    return sb


@in_module_loop
async def test_unittest_without_pytest(tmp_path: Path) -> None:
    project = make_repo(
        tmp_path / "ut",
        {
            "test_unit.py": (
                "import unittest\n\n"
                "class T(unittest.TestCase):\n"
                "    def test_ok(self):\n        self.assertEqual(1, 1)\n"
                "    def test_bad(self):\n        self.assertEqual(1, 2)\n"
                "    def test_boom(self):\n        raise ValueError('boom')\n"
                "    @unittest.skip('later')\n    def test_later(self):\n        pass\n"
            )
        },
    )
    plain = (
        subprocess.run(["/usr/bin/python3", "-c", "import pytest"], capture_output=True)
        if Path("/usr/bin/python3").exists()
        else None
    )
    if plain is None or plain.returncode == 0:
        pytest.skip("needs a system python3 without pytest at /usr/bin/python3")
    sb = await start(project, env={"PATH": "/usr/bin:/bin"})
    try:
        assert await detect_framework(sb) == "unittest"
        report = await run_tests_in(sb)
        assert report.framework == "unittest" and not report.structured
        assert (report.passed, report.failed, report.errors, report.skipped) == (1, 1, 1, 1)
        assert report.outcomes == {
            "test_unit.T.test_ok": "passed",
            "test_unit.T.test_bad": "failed",
            "test_unit.T.test_boom": "error",
            "test_unit.T.test_later": "skipped",
        }
        by_id = {f.test_id: f for f in report.failures}
        assert by_id["test_unit.T.test_bad"].message == "AssertionError: 1 != 2"
        assert "ValueError: boom" in by_id["test_unit.T.test_boom"].traceback
        one = await run_tests_in(sb, "test_unit.py::T::test_ok")
        assert one.all_passed and one.total == 1
    finally:
        await sb.close()


@in_module_loop
async def test_a_test_inherited_from_a_mixin_in_another_file_is_named_by_its_own_file(tmp_path: Path) -> None:
    """cachetools' layout: the test methods live in a mixin in ``tests/__init__.py`` that each test
    file's TestCase inherits; JUnit's ``file`` is the mixin's, the node id the TestCase's."""
    mixin = "class Mixin:\n    def test_shared(self):\n        assert self.VALUE > 0\n"
    case = (
        "import unittest\n\nfrom . import Mixin\n\n\nclass {0}(unittest.TestCase, Mixin):\n    VALUE = {1}\n"
    )
    files = {
        "tests/__init__.py": mixin,
        "tests/test_a.py": case.format("ATest", 1),
        "tests/test_b.py": case.format("BTest", -1),
        "pytest.ini": "[pytest]\n",
    }
    sb = await start(make_repo(tmp_path / "mixin", files))
    try:
        for guarded in (False, True):
            report = await run_tests_in(sb, guarded=guarded)
            assert report.outcomes == {
                "tests/test_a.py::ATest::test_shared": "passed",
                "tests/test_b.py::BTest::test_shared": "failed",
            }, guarded
            assert [f.test_id for f in report.failures] == ["tests/test_b.py::BTest::test_shared"]
    finally:
        await sb.close()


@in_module_loop
async def test_tests_deep_in_a_namespace_package_are_found(tmp_path: Path) -> None:
    """A zope-style project: no pytest configuration, its unittest tests in
    ``src/NAMESPACE/PACKAGE/tests/``, deeper than the first look; with a go.mod at the top the
    deep file is not looked for (it is not that project's test)."""
    deep = "src/zope/fmt/tests/test_fmt.py"
    test = "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
    files = {"src/zope/__init__.py": "", "src/zope/fmt/__init__.py": "", "src/zope/fmt/tests/__init__.py": ""}
    sb = await start(make_repo(tmp_path / "ns", {**files, deep: test, "tox.ini": "[testenv]\n"}))
    try:
        assert await detect_framework(sb) in ("pytest", "unittest")
        report = await run_tests_in(sb, deep)
        assert report.total == 1 and report.all_passed
    finally:
        await sb.close()
    sb = await start(make_repo(tmp_path / "go", {deep: test, "go.mod": "module example.com/x\n\ngo 1.21\n"}))
    try:
        assert await detect_framework(sb) == "go"
    finally:
        await sb.close()


@pytest.mark.parametrize(
    "files,expected",
    [
        ({"pytest.ini": "[pytest]\n", "a.py": ""}, "pytest"),
        ({"setup.cfg": "[tool:pytest]\ntestpaths = t\n"}, "pytest"),
        ({"tox.ini": "[pytest]\n"}, "pytest"),
        ({"package.json": '{"scripts": {"test": "node --test"}}'}, "npm"),
        ({"package.json": '{"scripts": {"test": "echo \\"Error: no test specified\\" && exit 1"}}'}, "none"),
        ({"go.mod": "module example.com/x\n\ngo 1.21\n"}, "go"),
        ({"Cargo.toml": '[package]\nname = "x"\nversion = "0.1.0"\n'}, "cargo"),
        ({"README.md": "nothing to test\n"}, "none"),
    ],
)
async def test_detection(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    sb = await start(make_repo(tmp_path / "d", files))
    try:
        assert await detect_framework(sb) == expected
        if expected == "none":
            report = await run_tests_in(sb)
            assert report.problem and "No test framework found" in report.problem
            assert report.summary() == report.problem  # no empty `$ ` command line, no empty output
        if "pytest.ini" in files:  # pytest configured, but no tests at all
            report = await run_tests_in(sb)
            assert report.exit_code == 5 and report.problem and "collected no tests" in report.problem
            assert not report.all_passed
    finally:
        await sb.close()


@in_module_loop
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm not installed")
async def test_npm_node_test_tap(tmp_path: Path) -> None:
    project = make_repo(
        tmp_path / "node",
        {
            "package.json": '{"name": "x", "version": "1.0.0", "scripts": {"test": "node --test"}}',
            "test/a.test.js": (
                "const test = require('node:test');\nconst assert = require('assert');\n"
                "test('adds', () => { assert.strictEqual(1 + 1, 2); });\n"
                "test('fails', () => { assert.strictEqual(1, 2); });\n"
                "test('later', { skip: true }, () => {});\n"
            ),
        },
    )
    sb = await start(project)
    try:
        report = await run_tests_in(sb)
        assert report.framework == "npm" and not report.structured
        assert (report.passed, report.failed, report.skipped) == (1, 1, 1)
        assert [f.test_id for f in report.failures] == ["fails"]
        assert "strictly equal" in report.failures[0].message
    finally:
        await sb.close()


@in_module_loop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo not installed")
async def test_cargo(tmp_path: Path) -> None:
    project = make_repo(
        tmp_path / "crate",
        {
            "Cargo.toml": '[package]\nname = "crate_under_test"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/lib.rs": (
                "#[cfg(test)]\nmod tests {\n"
                "    #[test]\n    fn good() { assert_eq!(2, 1 + 1); }\n"
                '    #[test]\n    fn bad() { assert_eq!(3, 1 + 1, "math is off"); }\n'
                "    #[test]\n    #[ignore]\n    fn later() {}\n}\n"
            ),
        },
    )
    sb = await start(project)
    try:
        report = await run_tests_in(sb)
        assert report.framework == "cargo", report.output
        assert (report.passed, report.failed, report.skipped) == (1, 1, 1), report.output
        assert [f.test_id for f in report.failures] == ["tests::bad"]
        assert "math is off" in report.failures[0].traceback
    finally:
        await sb.close()


def test_go_json_events_parse() -> None:
    """``go test -json`` is exact; go is not installed here, so this checks the parse on its event format."""
    events = [
        {"Action": "start", "Package": "ex.com/m"},
        {"Action": "run", "Package": "ex.com/m", "Test": "TestOk"},
        {"Action": "output", "Package": "ex.com/m", "Test": "TestOk", "Output": "=== RUN   TestOk\n"},
        {"Action": "pass", "Package": "ex.com/m", "Test": "TestOk", "Elapsed": 0},
        {"Action": "run", "Package": "ex.com/m", "Test": "TestBad"},
        {"Action": "output", "Package": "ex.com/m", "Test": "TestBad", "Output": "=== RUN   TestBad\n"},
        {
            "Action": "output",
            "Package": "ex.com/m",
            "Test": "TestBad",
            "Output": "    m_test.go:9: got 1, want 2\n",
        },
        {
            "Action": "output",
            "Package": "ex.com/m",
            "Test": "TestBad",
            "Output": "--- FAIL: TestBad (0.00s)\n",
        },
        {"Action": "fail", "Package": "ex.com/m", "Test": "TestBad", "Elapsed": 0},
        {"Action": "skip", "Package": "ex.com/m", "Test": "TestLater", "Elapsed": 0},
        {"Action": "fail", "Package": "ex.com/m", "Elapsed": 0.01},
    ]
    report = TestReport(framework="go", command="go test -json ./...", target=None, exit_code=1)
    parse_go_json("\n".join(json.dumps(e) for e in events) + "\nnot json\n", report)
    assert (report.passed, report.failed, report.skipped) == (1, 1, 1)
    assert report.outcomes == {
        "ex.com/m.TestOk": "passed",
        "ex.com/m.TestBad": "failed",
        "ex.com/m.TestLater": "skipped",
    }
    assert report.failures[0].test_id == "ex.com/m.TestBad"
    assert report.failures[0].message == "m_test.go:9: got 1, want 2"


RECORD_REPORT_PATH = """
def test_records_where_its_report_goes(request):
    with open("report-path.txt", "w") as out:
        out.write(request.config.option.xmlpath)
"""


def leftover_temp_folders(sb: Sandbox) -> list[Path]:
    """What is left in the local sandbox's private $TMPDIR (beside its copy of the repository)."""
    assert sb.host_workspace is not None
    return sorted((sb.host_workspace.parent / "tmp").iterdir())


async def test_the_junit_report_goes_to_a_private_folder_removed_after_the_run(tmp_path: Path) -> None:
    project = make_repo(tmp_path / "where", {"test_where.py": RECORD_REPORT_PATH})
    sb = await start(project)
    try:
        report = await run_tests_in(sb)
        assert report.structured and report.passed == 1
        xml_path = Path((await sb.read_file("/workspace/report-path.txt")).decode())
        assert sb.host_workspace is not None
        assert xml_path.is_relative_to(sb.host_workspace.parent / "tmp")  # not the host's shared /tmp
        assert not xml_path.parent.exists() and leftover_temp_folders(sb) == []
    finally:
        await sb.close()


async def test_timed_out_run_is_reported(tmp_path: Path) -> None:
    project = make_repo(
        tmp_path / "slow", {"test_slow.py": "import time\n\ndef test_sleeps():\n    time.sleep(60)\n"}
    )
    sb = await start(project)
    try:
        report = await run_tests_in(sb, timeout=2, test_timeout=60)  # no per-test limit first
        assert report.timed_out and report.exit_code is None and not report.all_passed
        assert report.problem and "timed out" in report.problem
        assert "The test run timed out after 2 s and was killed." in report.summary()
        assert leftover_temp_folders(sb) == []  # no report was written, and the folder is gone anyway
    finally:
        await sb.close()


HANGING_TESTS = {
    "test_hang.py": (
        "import time\n\n\ndef test_before():\n    pass\n\n\n"
        "def test_hangs():\n    time.sleep(600)\n\n\n"
        "def test_swallows():\n    try:\n        time.sleep(600)\n    except BaseException:\n        pass\n\n\n"
        "def test_after():\n    assert 1 + 1 == 2\n"
    ),
}


@pytest.mark.parametrize("guarded", [False, True], ids=["plain", "guarded"])
async def test_a_hanging_test_fails_alone_and_the_rest_runs(tmp_path: Path, guarded: bool) -> None:
    project = make_repo(tmp_path / "hang", HANGING_TESTS)
    sb = await start(project)
    try:
        report = await run_tests_in(sb, timeout=300, test_timeout=2, guarded=guarded)
        assert not report.timed_out and report.structured, report.output
        assert report.outcomes == {
            "test_hang.py::test_before": "passed",
            "test_hang.py::test_hangs": "failed",
            "test_hang.py::test_swallows": "failed",  # a swallowed timeout is no pass
            "test_hang.py::test_after": "passed",
        }
        messages = {f.test_id: f.message for f in report.failures}
        assert "timed out after 2 s" in messages["test_hang.py::test_hangs"]
        assert "timed out after 2 s" in messages["test_hang.py::test_swallows"]
        assert "time.sleep(600)" in next(f.traceback for f in report.failures if f.test_id.endswith("hangs"))
    finally:
        await sb.close()


async def test_a_test_that_changes_folder_still_imports_from_the_workspace(tmp_path: Path) -> None:
    """As under ``python -m pytest``, the workspace is on ``sys.path`` by its absolute path."""
    chdir_test = (
        "def test_imports_after_chdir(tmp_path, monkeypatch):\n"
        "    monkeypatch.chdir(tmp_path)\n    import helper_mod\n\n    assert helper_mod.X == 1\n"
    )
    project = make_repo(tmp_path / "chdir", {"helper_mod.py": "X = 1\n", "tests/test_chdir.py": chdir_test})
    sb = await start(project)
    try:
        report = await run_tests_in(sb)
        assert report.outcomes == {"tests/test_chdir.py::test_imports_after_chdir": "passed"}, report.output
    finally:
        await sb.close()


STRICT_WARNINGS = {
    "pytest.ini": "[pytest]\nfilterwarnings =\n    error\n",
    "test_strict.py": (
        "import warnings\n\nimport pytest\n\n"
        "# what a newer pytest says while collecting an older project (here said by the module itself)\n"
        "warnings.warn(pytest.PytestDeprecationWarning('this will be removed in a later pytest'))\n\n\n"
        "@pytest.mark.parametrize('n', (n for n in range(3)))  # a generator: pytest 9 deprecates it\n"
        "def test_param(n):\n    assert n < 3\n\n\n"
        "def test_own_deprecation_still_errors():\n"
        "    warnings.warn('the project deprecates this', DeprecationWarning)\n"
    ),
}


async def test_pytests_notices_about_its_own_future_do_not_break_a_strict_projects_collection(
    tmp_path: Path,
) -> None:
    """A project that turns warnings into errors, written for an older pytest: pytest's deprecation
    of its generator parametrize would fail the module's collection; the runs ignore pytest's own
    notices only, so the project's own warnings still fail its tests."""
    sb = await start(make_repo(tmp_path / "strict", STRICT_WARNINGS))
    try:
        report = await run_tests_in(sb)
        assert report.structured and report.errors == 0, report.summary()
        assert report.passed == 3 and report.failed == 1, report.summary()
        assert report.outcomes["test_strict.py::test_own_deprecation_still_errors"] == "failed"
    finally:
        await sb.close()
    # Without the filter the module does not even collect.
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_strict.py"],
        cwd=tmp_path / "strict",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode != 0 and "PytestDeprecationWarning" in plain.stdout, plain.stdout[-2000:]
    assert "error" in plain.stdout.splitlines()[-1], plain.stdout[-2000:]
