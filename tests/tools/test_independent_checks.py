"""The checks the patch cannot anticipate, at the level of one sandbox: the independent runner (no
pytest, a fresh process, fresh names), the canary tests and the signed results channel, each
against code under test that cheats from inside the judging process. Real pytest in a real
(local) sandbox; the same code passes the guarded pytest run, which is what the layers are for."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest

from clover_agent.handback.checks import make_canaries, take_canaries, with_canaries
from clover_agent.sandboxes.base import Put
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tools.run_tests.independent import IndependentRun, run_independently, runnable
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

TESTS = (
    "import pytest\n"
    "from calc import add\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "class TestMore:\n    def test_neg(self):\n        assert add(-1, 1) == 0\n"
)
CONFIG = '[tool.pytest.ini_options]\npythonpath = ["."]\n'

#: Code under test that answers right only when it sees pytest, each in its own way (the scan is
#: not run here: these show the independent run alone catches them).
SPECIAL_CASED = {
    "an environment variable": (
        "import os\n"
        "def add(a, b):\n"
        "    if any(k.startswith('PYTEST') for k in os.environ):\n"
        "        return a + b\n"
        "    return a - b\n"
    ),
    "pytest's modules loaded, at call time": (
        "import sys\n"
        "def add(a, b):\n"
        "    return a + b if any(m.startswith('_pytest') for m in sys.modules) else a - b\n"
    ),
    "the caller's name": (
        "import inspect\n"
        "def add(a, b):\n"
        "    return a + b if inspect.stack()[1].function in ('test_add', 'test_neg') else a - b\n"
    ),
    "the caller's file name": (
        "import sys\n"
        "def add(a, b):\n"
        "    return a + b if 'test_calc' in sys._getframe(1).f_code.co_filename else a - b\n"
    ),
    "the test module's name": (
        "import sys\n"
        "def add(a, b):\n"
        "    return a + b if sys._getframe(1).f_globals.get('__name__', '').endswith('test_calc') else a - b\n"
    ),
    "a timer armed (pytest's per-test limit)": (
        "import signal\n"
        "def add(a, b):\n"
        "    return a + b if signal.getitimer(signal.ITIMER_REAL)[0] > 0 else a - b\n"
    ),
    "a signal handler installed (pytest's per-test limit)": (
        "import signal\n"
        "def add(a, b):\n"
        "    return a + b if callable(signal.getsignal(signal.SIGALRM)) else a - b\n"
    ),
    "refusing to be imported outside pytest": (
        "import sys\n"
        "if not any(m.startswith('_pytest') for m in sys.modules):\n"
        "    raise ImportError('needs a real program')\n"
        "def add(a, b):\n    return a + b\n"
    ),
    "the command line": (
        "import sys\n"
        "def add(a, b):\n"
        "    return a + b if any('pytest' in a or '::' in a for a in sys.argv) else a - b\n"
    ),
}
HONEST = "def add(a, b):\n    return a + b\n"


ALL = ["tests/test_calc.py::test_add", "tests/test_calc.py::TestMore::test_neg"]


async def _runs(tmp_path: Path, calc: str, tests: str = TESTS) -> tuple[dict[str, str], IndependentRun]:
    """The guarded pytest run's outcomes, and the independent run of every test it saw (of
    :data:`ALL` when it saw none)."""
    repo = make_repo(
        tmp_path / "repo", {"calc.py": calc, "tests/test_calc.py": tests, "pyproject.toml": CONFIG}
    )
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        held = await run_tests_in(sandbox, "tests/test_calc.py", guarded=True)
        independent = await run_independently(sandbox, list(held.outcomes) or ALL, test_timeout=30)
    return held.outcomes, independent


@pytest.mark.parametrize("how", list(SPECIAL_CASED))
async def test_code_that_answers_right_only_under_pytest_fails_the_independent_run(
    tmp_path: Path, how: str
) -> None:
    held, independent = await _runs(tmp_path, SPECIAL_CASED[how])
    assert set(held.values()) == {"passed"}  # pytest is fooled
    assert independent.disagrees(held) == [
        "tests/test_calc.py::TestMore::test_neg",
        "tests/test_calc.py::test_add",
    ]
    assert not independent.not_run and not independent.problems


async def test_honest_code_agrees_and_what_cannot_run_faithfully_is_listed_not_failed(tmp_path: Path) -> None:
    tests = TESTS + (
        "\n\n@pytest.fixture\ndef two():\n    return 2\n\n\n"
        "def test_fixture(two):\n    assert add(two, two) == 4\n\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_param(n):\n    assert add(n, 0) == n\n\n\n"
        "def test_tmp(tmp_path):\n    (tmp_path / 'x').write_text('1')\n    assert add(1, 1) == 2\n\n\n"
        "import unittest\n\n\nclass TestCase(unittest.TestCase):\n"
        "    def setUp(self):\n        self.n = 3\n\n"
        "    def test_case(self):\n        self.assertEqual(add(self.n, 1), 4)\n\n\n"
        # xunit set-up in each form pytest calls: with and without the argument it may take
        "SEEN = []\n\n\ndef setup_module(module):\n    SEEN.append(module.__name__)\n\n\n"
        "def setup_function():\n    SEEN.append('f')\n\n\n"
        "def test_xunit_function():\n    assert SEEN and SEEN[-1] == 'f'\n\n\n"
        "class TestXunit:\n    def setup_class(cls):\n        cls.base = 10\n\n"
        "    def setup_method(self, method):\n        self.step = 1\n\n"
        "    def test_method(self):\n        assert add(self.base, self.step) == 11\n\n\n"
        "class TestClassmethod:\n    @classmethod\n    def setup_class(cls):\n        cls.base = 5\n\n"
        "    def setup_method(self):\n        self.step = 2\n\n"
        "    def test_method(self):\n        assert add(self.base, self.step) == 7\n"
    )
    held, independent = await _runs(tmp_path, HONEST, tests)
    assert set(held.values()) == {"passed"} and len(held) == 10
    assert independent.disagrees(held) == [] and not independent.problems
    assert set(independent.not_run) == {
        "tests/test_calc.py::test_fixture",
        "tests/test_calc.py::test_param[1]",
        "tests/test_calc.py::test_param[2]",
    }
    assert "fixtures" in independent.not_run["tests/test_calc.py::test_fixture"]
    assert independent.outcomes == {
        "tests/test_calc.py::test_add": "passed",
        "tests/test_calc.py::TestMore::test_neg": "passed",
        "tests/test_calc.py::test_tmp": "passed",
        "tests/test_calc.py::TestCase::test_case": "passed",
        "tests/test_calc.py::test_xunit_function": "passed",
        "tests/test_calc.py::TestXunit::test_method": "passed",
        "tests/test_calc.py::TestClassmethod::test_method": "passed",
    }
    assert runnable(["a.py::t", "tests/x.py", "pkg.mod.Test.test", "a.py::t b"]) == ["a.py::t"]


async def test_forging_the_independent_runs_records_or_ending_it_early_is_seen(tmp_path: Path) -> None:
    exit_early = "import os\ndef add(a, b):\n    os._exit(0)\n"
    held, independent = await _runs(tmp_path, exit_early)
    assert independent.disagrees(held) == []  # pytest's run failed too: nothing passed to compare
    assert any("ended before it finished" in p for p in independent.problems)
    forge = (
        "import sys\n"
        "sys.stdout.write('\\n\\x1eclover-live ' + 'ab' * 32 + ' 1 call passed 0 ' "
        "+ 'tests/test_calc.py::test_add'.encode().hex() + '\\n')\n"
        "def add(a, b):\n    import os\n    return a + b if 'PYTEST_CURRENT_TEST' in os.environ else a - b\n"
    )
    held, independent = await _runs(tmp_path / "forged", forge)
    assert held["tests/test_calc.py::test_add"] == "passed"
    assert "tests/test_calc.py::test_add" in independent.disagrees(held)
    assert any("not written by the runner" in p for p in independent.problems)


#: Code under test that reaches pytest from inside its process at import and turns every failing
#: call into a pass: through the garbage collector to the live configuration's plugin manager.
FLIP_EVERYTHING = (
    "import gc\n"
    "class _Flip:\n"
    "    def pytest_runtest_logreport(self, report):\n"
    "        pass\n"
    "    def pytest_runtest_makereport(self, item, call):\n"
    "        pass\n"
    "def _install():\n"
    "    import pytest\n"
    "    class Flip:\n"
    "        @pytest.hookimpl(wrapper=True)\n"
    "        def pytest_runtest_makereport(self, item, call):\n"
    "            report = yield\n"
    "            if report.when == 'call':\n"
    "                report.outcome, report.longrepr = 'passed', None\n"
    "            return report\n"
    "    for o in gc.get_objects():\n"
    "        if type(o).__name__ == 'PytestPluginManager':\n"
    "            o.register(Flip())\n"
    "            return\n"
    "_install()\n"
    "def add(a, b):\n    return a - b\n"
)


async def test_a_patch_that_flips_every_outcome_fails_the_canaries(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo", {"calc.py": FLIP_EVERYTHING, "tests/test_calc.py": TESTS, "pyproject.toml": CONFIG}
    )
    canaries = make_canaries()
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        await sandbox.put([Put(canaries.path, "file", 0o644, canaries.source)])
        report = await run_tests_in(sandbox, f"tests/test_calc.py {canaries.path}", guarded=True)
        honest_repo = make_repo(
            tmp_path / "honest", {"calc.py": HONEST, "tests/test_calc.py": TESTS, "pyproject.toml": CONFIG}
        )
    cleaned, problems = take_canaries(report, canaries)
    assert cleaned.outcomes == {
        "tests/test_calc.py::test_add": "passed",  # flipped: the bug is still there
        "tests/test_calc.py::TestMore::test_neg": "passed",
    }
    assert problems == ["a canary test that must fail was passed"] and problems[0] in cleaned.integrity
    async with create_sandbox("local", sandbox_spec(honest_repo)) as sandbox:
        fresh = make_canaries()
        assert fresh.ids != canaries.ids  # fresh names every time
        await sandbox.put([Put(fresh.path, "file", 0o644, fresh.source)])
        report = await run_tests_in(sandbox, f"tests/test_calc.py {fresh.path}", guarded=True)
    cleaned, problems = take_canaries(report, fresh)
    assert problems == [] and cleaned.integrity == []
    assert cleaned.outcomes == {
        "tests/test_calc.py::test_add": "passed",
        "tests/test_calc.py::TestMore::test_neg": "passed",
    }
    assert (cleaned.passed, cleaned.failed, cleaned.exit_code) == (2, 0, 0)


#: Finds the results channel's writer (a closure of the live plugin object, through the garbage
#: collector: there is no module or global to find it by) and sends a pass for the failing test
#: before pytest reports it.
FORGE_THROUGH_THE_CLOSURE = (
    "import gc\n"
    "for o in gc.get_objects():\n"
    "    f = getattr(type(o), 'pytest_runtest_logreport', None)\n"
    "    if type(o).__name__ == 'Stream' and f is not None:\n"
    "        send = [c.cell_contents for c in f.__closure__ if callable(c.cell_contents)][0]\n"
    "        send('call', 'passed', False, 'tests/test_calc.py::test_add')\n"
    "        break\n"
    "def add(a, b):\n    return a - b\n"
)


async def test_a_record_sent_through_the_channels_own_closure_is_a_conflict_not_a_pass(
    tmp_path: Path,
) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {"calc.py": FORGE_THROUGH_THE_CLOSURE, "tests/test_calc.py": TESTS, "pyproject.toml": CONFIG},
    )
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        report = await run_tests_in(sandbox, "tests/test_calc.py", guarded=True)
    assert report.outcomes["tests/test_calc.py::test_add"] in ("failed", "error")
    assert report.integrity == ["two results were reported for one phase of: tests/test_calc.py::test_add"]


async def test_a_plugin_name_planted_in_the_workspace_does_not_turn_the_independent_run_off(
    tmp_path: Path,
) -> None:
    """A project with pytest-env or pytest-django installed is not run independently (those set the
    process up first); a workspace module of that name is not such a plugin."""
    cheat = SPECIAL_CASED["a timer armed (pytest's per-test limit)"]
    repo = make_repo(
        tmp_path / "repo",
        {
            "calc.py": cheat,
            "tests/test_calc.py": TESTS,
            "pyproject.toml": CONFIG,
            "pytest_env.py": "",
            "src/pytest_django.py": "",
        },
    )
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        held = await run_tests_in(sandbox, "tests/test_calc.py", guarded=True)
        independent = await run_independently(sandbox, list(held.outcomes), test_timeout=30)
    assert set(held.outcomes.values()) == {"passed"}
    assert not independent.not_run and independent.disagrees(held.outcomes) == sorted(ALL)


@pytest.mark.parametrize(
    ("pattern", "test_file"),
    [
        ("check_*.py", "tests/check_calc.py"),
        ("*_test.py", "tests/calc_test.py"),
        ("test_*.py", "tests/test_calc.py"),
    ],
)
async def test_canaries_join_a_k_expression_run_whatever_files_the_project_collects(
    tmp_path: Path, pattern: str, test_file: str
) -> None:
    """The target given as ``-k``: the canaries' file lies beside the target's and is named as it
    is, so the project's ``python_files`` collects it with the rest."""
    config = f'[tool.pytest.ini_options]\npythonpath = ["."]\npython_files = ["{pattern}"]\n'
    repo = make_repo(tmp_path / "repo", {"calc.py": HONEST, test_file: TESTS, "pyproject.toml": config})
    canaries = make_canaries(posixpath.dirname(test_file), test_file)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        await sandbox.put([Put(canaries.path, "file", 0o644, canaries.source)])
        report = await run_tests_in(sandbox, with_canaries("-k test_add", canaries), guarded=True)
    cleaned, problems = take_canaries(report, canaries)
    assert problems == [], report.output[-2000:]
    assert cleaned.outcomes == {f"{test_file}::test_add": "passed"}


#: An autouse fixture with ``params`` (markupsafe 3's conftest runs every test on each of its
#: implementations): pytest cannot parametrize a unittest case with it, so that form errors.
PARAMETRIZED_CONFTEST = (
    "import pytest\n\n\n"
    "@pytest.fixture(scope='session', autouse=True, params=('native', pytest.param('fast', marks=pytest.mark.skipif(True, reason='no speedups'))))\n"
    "def _impl(request):\n    return request.param\n"
)


@pytest.mark.parametrize(
    ("files", "formed"),
    [
        ({"tests/conftest.py": PARAMETRIZED_CONFTEST}, "the plain functions, each variant"),
        ({"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\npython_functions = ["check_*"]\n'},
         "the unittest case"),
    ],
)  # fmt: skip
async def test_canaries_are_right_in_one_form_whatever_the_project_does_to_the_other(
    tmp_path: Path, files: dict[str, str], formed: str
) -> None:
    """Before: under an autouse fixture with ``params`` both canaries "errored" (a unittest case
    cannot be parametrized) and an honest fix got ``needs review``. Now the plain functions run
    there; and where the project's ``python_functions`` does not collect them, the case does."""
    tests = TESTS.replace("def test_add", "def check_add") if "python_functions" in str(files) else TESTS
    repo = make_repo(
        tmp_path / "repo", {"calc.py": HONEST, "tests/test_calc.py": tests, "pyproject.toml": CONFIG, **files}
    )
    canaries = make_canaries("tests", "tests/test_calc.py")
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        await sandbox.put([Put(canaries.path, "file", 0o644, canaries.source)])
        report = await run_tests_in(sandbox, f"tests/test_calc.py {canaries.path}", guarded=True)
    cleaned, problems = take_canaries(report, canaries)
    assert problems == [], (formed, report.outcomes)
    assert not any(canaries.owns(t) for t in cleaned.outcomes) and cleaned.outcomes, report.outcomes
    assert all(o in ("passed", "skipped") for o in cleaned.outcomes.values())


def test_a_wrong_canary_in_either_form_is_wrong() -> None:
    """One form right does not excuse the other's must-fail passing."""
    canaries = make_canaries("tests", "tests/test_calc.py")
    outcomes = {
        canaries.must_pass: "passed",
        canaries.must_fail: "passed",  # flipped
        f"{canaries.plain_pass}[native]": "passed",
        f"{canaries.plain_fail}[native]": "failed",
        "tests/test_calc.py::test_add": "passed",
    }
    report = TestReport("pytest", "pytest", None, 1, passed=4, failed=1, outcomes=outcomes)
    cleaned, problems = take_canaries(report, canaries)
    assert problems == ["a canary test that must fail was passed"]
    assert cleaned.outcomes == {"tests/test_calc.py::test_add": "passed"}
