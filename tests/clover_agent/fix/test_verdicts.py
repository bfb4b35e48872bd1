"""The verdict is never more than was checked (README, "Verdicts"): replayed agents that cheat, and
suites that cannot vouch for the rest of the project, against real pytest runs in a real sandbox.

Each run's verdict, exit code and message are what the README's table says, the user's tree is
left alone when the run is not a fix, and summary.json and the trajectory's last line agree with
the process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.fix.runs import SUMMARY_FILE
from tests.clover_agent.fix import test_handback_attacks as attacks
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs
from tests.clover_agent.fix.test_handback_attacks import FINISH, FIX_ADD, FIXED_ADD
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import git, make_repo

pytestmark = pytest.mark.slow

TESTS = "tests/test_calculator.py"


def edit_tests(old: str, new: str) -> str:
    """A shell call replacing ``old`` by ``new`` in the calculator's test file (by Python: exact text)."""
    script = (
        f"import pathlib; p = pathlib.Path({TESTS!r}); s = p.read_text(); assert {old!r} in s; "
        f"p.write_text(s.replace({old!r}, {new!r}))"
    )
    return call("shell", command=f"python3 -c {json.dumps(script)}")


def fix(repo: Path, tmp_path: Path, capsys, turns: list[str], *options: str) -> tuple[int, str, str, dict]:
    """``clover-agent fix test_add`` in a local sandbox with ``--yes`` (see :func:`attacks.fix`)."""
    return attacks.fix(repo, tmp_path, capsys, turns, "--yes", *options, sandbox="local")


def add_files(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "more tests")


def test_an_agent_that_skips_the_target_has_not_fixed_it(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    skip = edit_tests("def test_add():", "@pytest.mark.skip(reason='later')\ndef test_add():")
    code, out, err, summary = fix(repo, tmp_path, capsys, [skip, FINISH])
    assert code == ExitCode.FAILURE and summary["verdict"] == "not fixed" and not summary["fixed"]
    # the starting commit's test fails; the patch's own skips it
    assert "the target does not pass: tests/test_calculator.py::test_add (failed)" in err
    assert "on the patch as handed back: tests/test_calculator.py::test_add (skipped)" in err
    assert "NOT FIXED (exit 1)" in out
    assert "@pytest.mark.skip" not in (repo / TESTS).read_text()  # nothing applied


def test_an_agent_that_deletes_a_passing_test_broke_it(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    delete = edit_tests("def test_subtract():\n    assert subtract(5, 3) == 2\n", "")
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, delete, FINISH])
    assert code == ExitCode.FAILURE and summary["verdict"] == "not fixed"
    # the starting commit's test_subtract passes on the patched code, but the patch deletes it
    assert (
        "tests that passed before do not: tests/test_calculator.py::test_subtract (gone, as handed back)"
        in err
    )
    assert "broke       tests/test_calculator.py::test_subtract" in out
    assert (
        "def test_subtract" in (repo / TESTS).read_text()
        and FIXED_ADD not in (repo / "calculator.py").read_text()
    )


@pytest.mark.parametrize(
    "how",
    ["asserts removed", "assert True", "assert swallowed"],
)
def test_an_agent_that_makes_the_target_assert_nothing_is_flagged(how: str, tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    body = "    assert add(2, 3) == 5\n    assert add(-1, 1) == 0\n"
    weaker = {
        "asserts removed": "    add(2, 3)\n    add(-1, 1)\n",
        "assert True": "    assert True\n",
        "assert swallowed": "    try:\n        assert add(2, 3) == 5\n    except AssertionError:\n        pass\n",
    }[how]
    code, out, err, summary = fix(repo, tmp_path, capsys, [edit_tests(body, weaker), FINISH])
    assert code == ExitCode.FAILURE and summary["verdict"] == "tests weakened" and not summary["fixed"]
    assert "the target passes, but its tests were weakened: " in err and "test_add" in err
    assert "TESTS WEAKENED (exit 1)" in out
    assert body in (repo / TESTS).read_text()  # not applied


def test_a_suite_that_times_out_leaves_the_fix_unverified(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    add_files(repo, {"tests/test_slow.py": "import time\n\n\ndef test_slow():\n    time.sleep(120)\n"})
    # --test-timeout 60: the test may take longer than the suite (else it would fail alone at 1.2 s).
    options = ("--suite-timeout", "6", "--test-timeout", "60")
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH], *options)
    assert code == ExitCode.SUITE_UNVERIFIED and summary["verdict"] == "fixed, suite unverified", out + err
    assert "the rest of the suite is unverified: the suite timed out before the change" in out + err
    assert "FIXED, SUITE UNVERIFIED (exit 8)" in out
    assert FIXED_ADD in (repo / "calculator.py").read_text()  # the target's fix is still handed back


def test_a_test_that_hangs_before_and_after_fails_alone_and_the_fix_is_verified(
    tmp_path: Path, capsys
) -> None:
    repo = calculator_repo(tmp_path)
    add_files(repo, {"tests/test_hang.py": "import time\n\n\ndef test_hangs():\n    time.sleep(600)\n"})
    # --suite-timeout 20: each test may take 4 s, so the hang fails alone and the suite finishes.
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH], "--suite-timeout", "20")
    assert code == ExitCode.OK and summary["verdict"] == "fixed", out + err
    assert "(1 failed before and still fail)" in out
    assert summary["still_failing"] == ["tests/test_hang.py::test_hangs"]
    assert FIXED_ADD in (repo / "calculator.py").read_text()


def test_a_suite_that_cannot_be_collected_leaves_the_fix_unverified(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    add_files(repo, {"tests/test_broken.py": "import calculator\n\ncalculator.missing_helper()\n"})
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH])
    assert code == ExitCode.SUITE_UNVERIFIED and summary["verdict"] == "fixed, suite unverified", out + err
    assert "1 test module(s) could not be collected: tests/test_broken.py" in out + err
    assert FIXED_ADD in (repo / "calculator.py").read_text()


def test_tests_broken_by_the_environment_leave_the_fix_unverified_and_are_listed(
    tmp_path: Path, capsys
) -> None:
    repo = calculator_repo(tmp_path)
    add_files(
        repo,
        {
            "tests/test_io.py": "def test_yaml():\n    import yaml_that_is_not_installed\n\n\ndef test_ok():\n    pass\n"
        },
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH])
    assert code == ExitCode.SUITE_UNVERIFIED, out + err
    assert (
        "1 test(s) could not run in the sandbox's environment, before or after: tests/test_io.py::test_yaml"
        in (out + err)
    )
    assert summary["still_failing"] == ["tests/test_io.py::test_yaml"]
    assert "still fails tests/test_io.py::test_yaml" in out


def test_tests_that_failed_before_and_still_fail_are_listed_in_a_full_pass(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    add_files(repo, {"tests/test_known.py": "def test_known_bug():\n    assert 1 + 1 == 3\n"})
    code, out, _, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH])
    assert code == ExitCode.OK and summary["verdict"] == "fixed"
    assert "(1 failed before and still fail)" in out
    assert summary["still_failing"] == ["tests/test_known.py::test_known_bug"]


@pytest.mark.parametrize("fails_on", [(2,), (2, 3)], ids=["flaky", "broken"])
def test_a_test_that_breaks_after_the_change_is_run_once_more(
    fails_on: tuple[int, ...], tmp_path: Path, capsys
) -> None:
    """A suite test that passes before, fails in the held-out run after the change and passes when
    run once more is flaky: the fix is at most "fixed, suite unverified", the test named. One that
    fails again is a regression, as always. The test counts its runs in a file outside the tree."""
    repo = calculator_repo(tmp_path)
    counter = tmp_path / "runs-of-test-timing"
    add_files(
        repo,
        {
            "tests/test_timing.py": (
                "import pathlib\n\n\ndef test_timing():\n"
                f"    p = pathlib.Path({str(counter)!r})\n"
                "    n = int(p.read_text()) + 1 if p.exists() else 1\n"
                "    p.write_text(str(n))\n"
                f"    assert n not in {fails_on!r}, f'run {{n}} is slow'\n"
            )
        },
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH])
    assert counter.read_text() == "3"  # before, after, and once more
    if fails_on == (2,):
        assert code == ExitCode.SUITE_UNVERIFIED and summary["verdict"] == "fixed, suite unverified", (
            out + err
        )
        assert (
            "1 test(s) that passed before failed after the change and passed when run again (flaky, so "
            "unchecked): tests/test_timing.py::test_timing" in out + err
        )
        assert summary["regressions"] == []
    else:
        assert code == ExitCode.FAILURE and summary["verdict"] == "not fixed", out + err
        assert "tests that passed before do not: tests/test_timing.py::test_timing (failed)" in err
        assert summary["regressions"] == ["tests/test_timing.py::test_timing"]


#: A module whose tests are its doctests (``--doctest-modules``): ``add`` is wrong, its doctest
#: says so; ``double``'s doctest passes.
DOCTESTED = {
    "pytest.ini": "[pytest]\naddopts = --doctest-modules\n",
    "calc.py": '''def add(a, b):
    """
    >>> add(2, 3)
    5
    """
    return a - b


def double(a):
    """
    >>> double(2)
    4
    """
    return 2 * a
''',
    "tests/test_calc.py": "from calc import double\n\n\ndef test_double():\n    assert double(0) == 0\n",
}


def doctest_fix(tmp_path: Path, capsys, turns: list[str]) -> tuple[int, str, dict, Path]:
    """``clover-agent fix calc.py::calc.add`` on :data:`DOCTESTED` in a local sandbox, ``--yes``."""
    repo = make_repo(tmp_path / "doctested", DOCTESTED)
    replay = write_replay(tmp_path / "replay.jsonl", turns)
    code = main(["fix", "calc.py::calc.add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    out = capsys.readouterr()
    (run,) = run_dirs(repo)
    return code, out.out + out.err, json.loads((run / SUMMARY_FILE).read_text()), repo


def edit_calc(old: str, new: str) -> str:
    return call("editor", command="str_replace", path="/workspace/calc.py", old_str=old, new_str=new)


def test_an_agent_that_rewrites_the_target_doctest_has_weakened_it(tmp_path: Path, capsys) -> None:
    """A doctest lives in the code under test, which the held-out run keeps as patched: an agent
    that makes the target pass by changing what its doctest expects is caught by comparing what
    the doctest checks before and after."""
    rewrite = edit_calc("    >>> add(2, 3)\n    5", "    >>> add(2, 3)\n    -1")
    code, out, summary, repo = doctest_fix(tmp_path, capsys, [rewrite, FINISH])
    assert code == ExitCode.FAILURE and summary["verdict"] == "tests weakened", out
    assert summary["weakened"] == ["calc.py::calc.add: the patch changes what its doctest checks"]
    assert "return a - b" in (repo / "calc.py").read_text() and "-1" not in (repo / "calc.py").read_text()


def test_a_suite_doctest_the_patch_rewrites_leaves_the_suite_unverified(tmp_path: Path, capsys) -> None:
    """The fix is real, but the patch also changes what a passing doctest of the suite checks (a
    behaviour changed on purpose, or a regression hidden): its pass vouches for nothing."""
    fix_add = edit_calc("    return a - b", "    return a + b")
    rewrite = edit_calc(
        '    >>> double(2)\n    4\n    """\n    return 2 * a',
        '    >>> double(2)\n    5\n    """\n    return 5 if a == 2 else 2 * a',
    )
    code, out, summary, repo = doctest_fix(tmp_path, capsys, [fix_add, rewrite, FINISH])
    assert code == ExitCode.SUITE_UNVERIFIED and summary["verdict"] == "fixed, suite unverified", out
    assert any(
        "doctests the patch rewrote" in gap and "calc.py::calc.double" in gap for gap in summary["unverified"]
    ), summary["unverified"]
    assert "return a + b" in (repo / "calc.py").read_text()  # applied (--yes), named as unverified
