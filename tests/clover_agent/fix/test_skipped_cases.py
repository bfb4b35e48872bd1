"""A parametrized case of the target that is skipped where it runs is neither a failure nor hidden:
``fix`` on a node id whose cases fail, pass and skip, with replayed agents (recorded turns, not a
model) in a real local sandbox with real pytest runs. A case skipped before and after is listed
(console, summary.json, the verdict's message) and does not stop a fix; a case the change makes
skip is not fixed, even when the skip comes from the code under test, where no test file changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.fix.runs import SUMMARY_FILE
from tests.clover_agent.fix.test_fix import run_dirs
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import make_repo

pytestmark = pytest.mark.slow

TARGET = "tests/test_calc.py::test_double"
CALC = 'def double(x):\n    """Twice x."""\n    return x + 2\n'
TESTS = """\
import pytest

from calc import double


@pytest.mark.parametrize(
    "x",
    [
        pytest.param(1, id="a"),
        pytest.param(2, id="b", marks=pytest.mark.skipif(True, reason="needs a GPU")),
        pytest.param(3, id="c"),
    ],
)
def test_double(x):
    if x == 3:
        pytest.skip("c runs only on Windows")
    assert double(x) == 2 * x


def test_other():
    assert double(2) == 4
"""
FIX = call("shell", command="sed -i 's/x + 2/x * 2/' calc.py && cat calc.py")
FINISH = call("finish", summary="Fixed double.")
SKIPPED = [f"{TARGET}[b]", f"{TARGET}[c]"]


def double_repo(tmp_path: Path) -> Path:
    """``test_double[a]`` fails; ``[b]`` is skipped by its marker and ``[c]`` by ``pytest.skip``."""
    return make_repo(tmp_path / "project", {"calc.py": CALC, "tests/test_calc.py": TESTS})


def fix(repo: Path, tmp_path: Path, capsys, turns: list[str]) -> tuple[int, str, str, dict]:
    """``clover-agent fix TARGET --yes`` in a local sandbox: (exit code, stdout, stderr, summary.json)."""
    replay = write_replay(tmp_path / "replay.jsonl", turns)
    code = main(["fix", TARGET, "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["exit_code"] == code
    return code, out.out, out.err, summary


def test_cases_skipped_before_and_after_do_not_stop_the_fix_and_are_named(tmp_path: Path, capsys) -> None:
    """Before: the skipped cases counted as target tests that do not pass ("not fixed")."""
    repo = double_repo(tmp_path)
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX, FINISH])
    assert code == ExitCode.OK and summary["verdict"] == "fixed", out + err
    assert summary["target_skipped"] == SKIPPED
    assert summary["target_not_passing"] == {}
    assert summary["tests"]["target_after"]["outcomes"] == {
        f"{TARGET}[a]": "passed",
        f"{TARGET}[b]": "skipped",
        f"{TARGET}[c]": "skipped",
    }
    # In words: the verdict's message, the summary's own line, the test runs' counts.
    assert f"2 target test(s) skipped before and after, so not checked: {', '.join(SKIPPED)}" in out
    assert f"  skipped     {'; '.join(SKIPPED)} (target tests skipped before and after: not checked)" in out
    assert "  before      target: 0 passed, 1 failed, 2 skipped; suite: 1 passed, 1 failed, 2 skipped" in out
    assert "tests target before: 0 passed, 1 failed, 0 errors, 2 skipped" in out
    assert "return x * 2" in (repo / "calc.py").read_text()  # handed back


def test_a_case_the_change_makes_skip_is_not_fixed_even_from_the_code_under_test(
    tmp_path: Path, capsys
) -> None:
    """The agent makes the failing case skip from calc.py (no test file changes, so no held-out run
    and no weakened-test check sees it): that case is not fixed; the cases skipped all along are
    not what stops it."""
    repo = double_repo(tmp_path)
    gaming = (
        'printf \'def double(x):\\n    if x == 1:\\n        import pytest\\n        pytest.skip("later")\\n'
        "    return x * 2\\n' > calc.py"
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [call("shell", command=gaming), FINISH])
    assert code == ExitCode.FAILURE and summary["verdict"] == "not fixed" and not summary["fixed"], out + err
    assert summary["target_not_passing"] == {f"{TARGET}[a]": "skipped"}
    assert f"the target does not pass: {TARGET}[a] (skipped)" in err
    assert "[b] (skipped)" not in err and "[c] (skipped)" not in err
    assert summary["target_skipped"] == SKIPPED  # still listed, as skipped throughout
    assert "NOT FIXED (exit 1)" in out
    assert (repo / "calc.py").read_text() == CALC  # nothing applied


def test_a_target_whose_only_cases_left_are_skipped_has_nothing_to_fix(tmp_path: Path, capsys) -> None:
    """Passing and skipped cases only: nothing to fix, and the skipped ones are counted in the message."""
    repo = make_repo(
        tmp_path / "project",
        {"calc.py": CALC.replace("x + 2", "x * 2"), "tests/test_calc.py": TESTS},
    )
    code, _, err, summary = fix(repo, tmp_path, capsys, [FINISH])
    assert code == ExitCode.NOTHING_TO_FIX, err
    assert f"nothing to fix: {TARGET!r} selects 3 tests and none fails (1 passed, 2 skipped)" in err
    assert summary["tests"]["target_before"]["skipped"] == 2
