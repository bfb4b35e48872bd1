"""A TARGET such as "the failing test" or "fix the bug" names no test but the tests failing now:
``fix`` runs the suite, works on its failing tests and says which and why; with none failing it
says so (exit 5). Node ids, files and test names holding the same words keep their meaning.
Replayed agents (recorded turns, not a model), a real local sandbox and real pytest runs; on real
projects in Docker, tests/clover_agent/fix/test_real_projects.py's second runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.events import TestsRun
from clover_agent.fix.console import ConsoleRenderer, make_console
from clover_agent.fix.runs import SUMMARY_FILE
from clover_agent.fix.targets import means_failing_now
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import git, make_repo

FIX_ADD = call(
    "shell",
    command="sed -i '0,/return a - b/s//return a + b/' calculator.py && grep -n 'a [-+] b' calculator.py",
)
FINISH = call("finish", summary="Fixed add.")
ADD = "tests/test_calculator.py::test_add"


def fix(repo: Path, tmp_path: Path, capsys, target: str, turns: list[str]) -> tuple[int, str, str, dict]:
    """``clover-agent fix TARGET --yes`` in a local sandbox: (exit code, stdout, stderr, summary.json),
    the trajectory's last line agreeing with the process."""
    replay = write_replay(tmp_path / f"replay-{len(list(tmp_path.iterdir()))}.jsonl", turns)
    code = main(["fix", target, "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    run = run_dirs(repo)[-1]
    summary = json.loads((run / SUMMARY_FILE).read_text())
    last = json.loads((run / "trajectory.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "task_finished" and last["exit_code"] == code == summary["exit_code"]
    return code, out.out, out.err, summary


@pytest.mark.parametrize(
    "phrase",
    [
        "the failing test",
        "the failing tests",
        "failing test",
        "fix the failing test",
        "fix the bug",
        "Make the failing tests pass.",
        "fix it",
        "the tests are broken",
    ],
)
def test_phrases_that_name_the_tests_failing_now(phrase: str, tmp_path: Path) -> None:
    assert means_failing_now(phrase, tmp_path)


@pytest.mark.parametrize(
    "target",
    [
        "tests/test_bug.py::test_the_failing_test",  # a node id
        "tests/test_failing.py",  # a file
        "test_fix_the_bug",  # a test name (a -k keyword)
        "-k failing and test",
        "failing and not test",  # a -k expression
        "failing",  # one word: a keyword, as before
        "the test",  # no word of failure: free text matched against test names
        "the parser is failing",  # names something: free text
        "fix the failing test in the parser",
    ],
)
def test_node_ids_names_and_descriptions_keep_their_meaning(target: str, tmp_path: Path) -> None:
    assert not means_failing_now(target, tmp_path)


def test_a_file_or_folder_named_like_the_phrase_is_that_file(tmp_path: Path) -> None:
    (tmp_path / "failing tests").mkdir()
    assert not means_failing_now("failing tests", tmp_path)
    assert means_failing_now("the failing tests", tmp_path)


def test_the_chosen_tests_are_shown_terminal_safe() -> None:
    """Test ids come from the repository: an escape sequence in one is shown, not obeyed."""
    out = io.StringIO()
    render = ConsoleRenderer(make_console(out, environ={}))
    report = {"passed": 0, "failed": 1, "errors": 0, "skipped": 1}
    render(TestsRun(phase="target_before", target="t.py::test_x[\x1b[2J]", report=report, chosen="why"))
    text = out.getvalue()
    assert "\x1b" not in text and "target: t.py::test_x[" in text and " — why" in text
    assert "tests target before: 0 passed, 1 failed, 0 errors, 1 skipped" in text


@pytest.mark.slow
@pytest.mark.parametrize("phrase", ["the failing test", "fix the bug"])
def test_the_failing_test_means_the_tests_failing_in_the_suite(phrase: str, tmp_path: Path, capsys) -> None:
    """Before: every word of the phrase is too common to match a test name, so it matched none
    (exit 2, "no test matches")."""
    repo = calculator_repo(tmp_path)
    code, out, err, summary = fix(repo, tmp_path, capsys, phrase, [FIX_ADD, FINISH])
    assert code == ExitCode.OK and summary["verdict"] == "fixed", out + err
    assert summary["mode"] == "failing tests" and summary["target"] == f"{ADD} (failing in the suite)"
    # which tests, and why: the suite's failing ones, because of what TARGET says
    assert (
        f"target: {ADD} — the 1 test(s) failing in the suite ({phrase!r} names the tests failing now)"
    ) in out
    assert f"… tests before: {phrase!r} names the tests failing now: running the suite to find" in out
    assert out.index("tests suite before: 4 passed, 1 failed") < out.index(f"target: {ADD}")
    assert "return a + b" in (repo / "calculator.py").read_text()


@pytest.mark.slow
def test_the_failing_tests_with_none_failing_is_nothing_to_fix(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    text = (repo / "calculator.py").read_text()
    (repo / "calculator.py").write_text(text.replace("return a - b", "return a + b", 1))
    git(repo, "commit", "-qam", "fixed")
    code, _, err, summary = fix(repo, tmp_path, capsys, "the failing tests", [FINISH])
    assert code == ExitCode.NOTHING_TO_FIX, err
    assert (
        "nothing to fix: 'the failing tests' means the tests failing now, and no test fails "
        "(5 passed, 0 skipped)"
    ) in err
    assert summary["verdict"] == "" and summary["tests"]["suite_before"]["passed"] == 5


@pytest.mark.slow
def test_a_test_named_with_the_words_is_still_that_test(tmp_path: Path, capsys) -> None:
    """``test_fix_the_bug`` passes while another test fails: naming it selects it (nothing to fix),
    not the failing one."""
    repo = make_repo(
        tmp_path / "project",
        {
            "tests/test_bug.py": "def test_fix_the_bug():\n    pass\n\n\ndef test_the_failing_test():\n"
            "    pass\n\n\ndef test_other():\n    assert 1 == 2\n",
        },
    )
    for target in ("test_fix_the_bug", "tests/test_bug.py::test_the_failing_test"):
        code, _, err, _ = fix(repo, tmp_path, capsys, target, [FINISH])
        assert code == ExitCode.NOTHING_TO_FIX, err
        assert f"nothing to fix: {target!r} selects 1 test and none fails" in err
