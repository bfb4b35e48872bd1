"""``clover-agent fix`` end to end on a real git repository (a copy of examples/calculator).

The replay backend stands in for the model (examples/calculator-fix.replay.jsonl: recorded turns,
not a model); everything else is real: the sandbox, the tools, pytest runs, git apply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clover_agent.agent import load_trajectory
from clover_agent.agent.approvals import Answer, Approvals, Reply
from clover_agent.agent.trajectory import TRAJECTORY_FILE, read_events
from clover_agent.cli import main
from clover_agent.cli.handback import hand_back
from clover_agent.errors import ExitCode
from clover_agent.events import ApprovalRequested
from clover_agent.fix.console import TerminalApprover, ask_at_terminal, make_console
from clover_agent.fix.runs import PATCH_FILE, SUMMARY_FILE
from clover_agent.fix.targets import match_tests
from clover_agent.handback.patches import changed_files, is_test_file
from tests.cli_process import start_signalable
from tests.clover_agent.fix.stocked import stocked_report
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import git, make_repo

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "calculator"
#: Outside the project folder, so a real model working on the example cannot read the answer.
REPLAY = ROOT / "examples" / "calculator-fix.replay.jsonl"
pytestmark = pytest.mark.slow


def calculator_repo(tmp_path: Path, *, nested: bool = False) -> Path:
    """A git repository holding a copy of the example; ``nested`` puts it in a subfolder of the
    repository (as examples/calculator is in this one)."""
    root = tmp_path / "project"
    repo = root / "examples" / "calculator" if nested else root
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns(".clover", "__pycache__", ".pytest_cache"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "calculator with a bug")
    return repo


def hanging_call(marker: Path) -> str:
    """A shell call that creates ``marker`` (on the host: the local sandbox runs there), then hangs."""
    return call("shell", command=f"touch {marker} && sleep 60")


def interrupt_fix(repo: Path, replay: Path, *, started: Path) -> tuple[Path, int, str, str]:
    """Run ``clover-agent fix test_add`` on ``replay`` (local sandbox) in its own process and press
    Ctrl-C once ``started`` exists (a :func:`hanging_call` is running). Returns the trajectory, the
    exit code, stdout and stderr."""
    proc = start_signalable(
        [sys.executable, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--backend", "replay",
         "--replay", str(replay), "--sandbox", "local"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not started.exists():
        time.sleep(0.1)
    assert started.exists(), proc.communicate()
    (trajectory,) = (repo / ".clover" / "runs").glob(f"*/{TRAJECTORY_FILE}")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return trajectory, proc.returncode, out, err


def run_dirs(repo: Path) -> list[Path]:
    return sorted(p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())


def suite_passes(repo: Path) -> bool:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


def assert_fixed(repo: Path, changed: str = "calculator.py") -> Path:
    assert "return a + b" in (repo / "calculator.py").read_text()
    assert suite_passes(repo)
    (run,) = run_dirs(repo)
    assert "+    return a + b" in (run / PATCH_FILE).read_text()
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert (
        summary["fixed"]
        and summary["files_changed"] == ["calculator.py"]
        and summary["test_files_changed"] == []
        and summary["hand_back"] == "applied"
    )
    assert summary["tests"]["suite_before"]["failed"] == 1 and summary["tests"]["suite_after"]["passed"] == 5
    state = load_trajectory(run / "trajectory.jsonl")
    assert state.last_outcome == "submitted" and state.steps == 5
    assert git(repo, "status", "--porcelain") == f" M {changed}\n"  # run records are git-ignored
    return run


def test_fix_repairs_the_calculator_with_a_local_sandbox(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path, nested=True)
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", "test_add", "--repo", str(repo), "--backend", "replay",
         "--replay", str(REPLAY), "--sandbox", "local", "--yes"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "FIXED" in proc.stdout and "replayed turns, not a model" in proc.stdout
    assert "→ editor command=str_replace" in proc.stdout  # the console renderer showed the calls
    # The summary: tests before and after, files changed, model calls, tokens in and out, time.
    assert "  before      target: 0 passed, 1 failed; suite: 4 passed, 1 failed\n" in proc.stdout
    assert "  after       target: 1 passed, 0 failed; suite: 5 passed, 0 failed\n" in proc.stdout
    assert "  changed     calculator.py\n" in proc.stdout
    assert re.search(
        r"^  agent       submitted; 5 model calls; [1-9][\d,]* tokens in, [1-9][\d,]* out; backend replay",
        proc.stdout,
        re.M,
    )
    assert re.search(r"^  time        \d+\.\d s$", proc.stdout, re.M)
    assert "Applied to" in proc.stdout
    assert_fixed(repo, changed="examples/calculator/calculator.py")


@pytest.mark.docker
def test_fix_repairs_the_calculator_in_docker(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "tests/test_calculator.py::test_add", "--repo", str(repo), "--backend", "replay",
                 "--replay", str(REPLAY), "--sandbox", "docker", "--yes"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "(node id)" in out.out
    assert_fixed(repo)


def test_dry_run_keeps_the_patch_and_applying_respects_local_changes(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "adding numbers is wrong", "--repo", str(repo), "--backend", "replay",
                 "--replay", str(REPLAY), "--sandbox", "local", "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tests/test_calculator.py::test_add (free text)" in out and "Dry run" in out
    assert "return a - b" in (repo / "calculator.py").read_text()  # not applied
    (run,) = run_dirs(repo)
    patch = run / PATCH_FILE
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["fixed"] and summary["hand_back"] == "dry run" and summary["verdict"] == "fixed"
    assert not (run / "shadow.git").exists()  # only the patch file stays

    # The kept patch applies by hand with the command printed, and not over local changes.
    (hint,) = re.findall(r"To apply it: (git .*)$", out, re.M)
    original = (repo / "calculator.py").read_text()
    (repo / "calculator.py").write_text(original.replace("def add", "# my own work\ndef add"))
    assert subprocess.run(hint, shell=True, capture_output=True).returncode != 0
    (repo / "calculator.py").write_text(original)
    assert subprocess.run(hint, shell=True, capture_output=True).returncode == 0, patch.read_text()
    assert suite_passes(repo)


async def test_no_terminal_without_yes_does_not_apply(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    report = await stocked_report(
        repo, repo / ".clover" / "runs" / "r1", "sed -i '0,/a - b/s//a + b/' calculator.py"
    )
    args = argparse.Namespace(yes=False, dry_run=False)
    if sys.stdin.isatty():
        pytest.skip("stdin is a terminal here")
    assert hand_back(report, repo, args, make_console()) == ExitCode.OK
    out = capsys.readouterr().out
    assert "No terminal to confirm" in out and f"git -C {repo} apply {report.patch_path}" in out
    assert json.loads((report.run_dir / SUMMARY_FILE).read_text())["hand_back"] == "no terminal to confirm"
    assert "return a - b" in (repo / "calculator.py").read_text()


async def test_ctrl_d_at_the_apply_question_is_no(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A terminal (a real pseudo-terminal) on which the user answers with Ctrl-D (end of input)."""
    repo = calculator_repo(tmp_path)
    report = await stocked_report(
        repo, repo / ".clover" / "runs" / "r1", "sed -i '0,/a - b/s//a + b/' calculator.py"
    )
    main_fd, terminal_fd = pty.openpty()
    with os.fdopen(terminal_fd, "r") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)
        os.write(main_fd, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert (
            hand_back(report, repo, argparse.Namespace(yes=False, dry_run=False), make_console())
            == ExitCode.OK
        )
    os.close(main_fd)
    out = capsys.readouterr().out
    assert "modified     calculator.py" in out and "Not applied. To apply it later:" in out
    assert json.loads((report.run_dir / SUMMARY_FILE).read_text())["hand_back"] == "declined"


async def test_ctrl_d_at_an_approval_question_is_no(monkeypatch: pytest.MonkeyPatch) -> None:
    main_fd, terminal_fd = pty.openpty()
    with os.fdopen(terminal_fd, "r") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)
        os.write(main_fd, b"\x04")
        assert await ask_at_terminal("shell", {"command": "curl example.com"}, "network") == Reply(
            Answer.DENY
        )
    os.close(main_fd)


@pytest.mark.parametrize(
    ("typed", "reply"),
    [
        ("y", Reply(Answer.ONCE)),
        ("Always", Reply(Answer.ALWAYS)),
        ("", Reply(Answer.DENY)),
        ("no", Reply(Answer.DENY)),
        ("  read the vendored copy instead  ", Reply(Answer.DENY, "read the vendored copy instead")),
    ],
)
async def test_a_denial_at_the_terminal_can_say_what_to_do_instead(
    typed: str, reply: Reply, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """The answer typed at a real pseudo-terminal reaches the run's approvals as it would the agent:
    words that are none of the choices are a "no" that carries them. The question says what an
    "always" would allow."""
    approvals = Approvals()
    approver = TerminalApprover(approvals)
    main_fd, terminal_fd = pty.openpty()
    with os.fdopen(terminal_fd, "r") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)
        os.write(main_fd, typed.encode() + b"\n")
        approvals.open("c1", "rule")
        approver(ApprovalRequested(step=1, call_id="c1", name="shell", arguments={"command": "curl x"},
                                   reason="network", always="`shell` running exactly `curl x` again"))  # fmt: skip
        assert await asyncio.wait_for(approvals.wait_reply("c1"), 60) == reply
    os.close(main_fd)
    assert approvals.allowed_always("rule") is (reply.answer is Answer.ALWAYS)
    shown = capfd.readouterr().out
    assert "[a] always allows `shell` running exactly `curl x` again." in shown
    assert shown.rstrip().endswith("[N] no, or type what to do instead:")


def test_patch_helpers() -> None:
    patch = "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\ndiff --git a/tests/test_x.py b/tests/test_x.py\n"
    assert changed_files(patch) == ["src/x.py", "tests/test_x.py"]
    assert [f for f in changed_files(patch) if is_test_file(f)] == ["tests/test_x.py"]
    assert (
        is_test_file("conftest.py") and is_test_file("web/app.spec.ts") and not is_test_file("src/testing.py")
    )


# --- error paths: a clear message, a saved trajectory, a documented exit code, no traceback -----


def fix_error(repo: Path, capsys, *args: str) -> tuple[int, str, list]:
    code = main(["fix", *args, "--repo", str(repo), "--sandbox", "local", "--yes"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (run,) = run_dirs(repo)
    events = read_events(run / "trajectory.jsonl")
    assert any(e.type == "done" for e in events)
    # The trajectory ends with the command's verdict: its exit code and message, as in the summary.
    assert events[-1].type == "task_finished" and events[-1].exit_code == code
    assert events[-1].message and events[-1].message in err
    assert json.loads((run / SUMMARY_FILE).read_text()) == events[-1].report
    return code, err, events


def test_nothing_failing_stops_with_exit_5(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code, err, events = fix_error(
        repo, capsys, "test_subtract", "--backend", "replay", "--replay", str(REPLAY)
    )
    assert code == ExitCode.NOTHING_TO_FIX
    assert "nothing to fix: 'test_subtract' selects 1 test and none fails" in err
    assert not any(e.type == "run_started" for e in events)  # the model was never asked


def test_target_matching_nothing_is_a_usage_error(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code, err, _ = fix_error(
        repo, capsys, "zebra quantum flux", "--backend", "replay", "--replay", str(REPLAY)
    )
    assert code == ExitCode.USAGE and "no test matches" in err


def test_a_run_stopped_before_the_agent_is_headed_not_run(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "zebra quantum flux", "--repo", str(repo), "--backend", "replay", "--replay",
                 str(REPLAY), "--sandbox", "local", "--yes"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == ExitCode.USAGE
    assert (
        "clover-agent fix: NOT RUN: usage or configuration error (exit 2)" in out and "NOT FIXED" not in out
    )


def test_a_free_text_target_of_any_length_is_free_text(tmp_path: Path, capsys) -> None:
    """Longer than a file name may be (255 bytes): matched as words, never looked up as a path."""
    repo = calculator_repo(tmp_path)
    long_text = "the add function of the calculator module " + "really " * 60 + "does not add two numbers"
    assert len(long_text.encode()) > 255
    code = main(["fix", long_text, "--repo", str(repo), "--backend", "replay", "--replay", str(REPLAY),
                 "--sandbox", "local", "--dry-run"])  # fmt: skip
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "File name too long" not in captured.err
    assert code == ExitCode.OK, captured.err
    assert "test_add" in captured.out  # the words chose the test


def test_a_misspelt_test_name_suggests_the_closest(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code, err, _ = fix_error(repo, capsys, "test_sbutract", "--backend", "replay", "--replay", str(REPLAY))
    assert code == ExitCode.USAGE and "no test matches 'test_sbutract'" in err
    assert "the closest: tests/test_calculator.py::test_subtract" in err
    assert "such as tests/test_calculator.py::test_subtract." in err


def test_a_subfolder_without_a_project_file_gets_a_note(tmp_path: Path, capsys) -> None:
    """`cd tests && clover-agent fix test_add`: only tests/ would go into the sandbox."""
    repo = calculator_repo(tmp_path)
    code, err, _ = fix_error(
        repo / "tests", capsys, "test_add", "--backend", "replay", "--replay", str(REPLAY)
    )
    assert code != ExitCode.OK
    assert f"note: only {repo / 'tests'} goes into the sandbox" in err and f"--repo {repo}" in err
    nested = calculator_repo(tmp_path / "nested", nested=True)  # a project in a subfolder: no note
    code, err, _ = fix_error(nested, capsys, "test_subtract", "--backend", "replay", "--replay", str(REPLAY))
    assert code == ExitCode.NOTHING_TO_FIX and "note:" not in err


def test_a_target_file_that_does_not_exist_is_named(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code, err, _ = fix_error(
        repo, capsys, "tests/test_calculater.py", "--backend", "replay", "--replay", str(REPLAY)
    )
    assert (
        code == ExitCode.USAGE
        and f"TARGET 'tests/test_calculater.py' looks like a file, but {repo} has no such file" in err
        and "did you mean tests/test_calculator.py" in err
    )


def test_a_repository_without_tests_is_named_as_such(tmp_path: Path, capsys) -> None:
    repo = make_repo(tmp_path / "no-tests", {"app.py": "x = 1\n"})
    code, err, _ = fix_error(repo, capsys, "test_add", "--backend", "replay", "--replay", str(REPLAY))
    assert code == ExitCode.USAGE and f"found no tests in {repo} (no pytest or unittest files" in err


def test_replay_exhausted_and_budget_exhausted(tmp_path: Path, capsys) -> None:
    short = tmp_path / "short.jsonl"
    short.write_text(REPLAY.read_text().splitlines()[0] + "\n")
    repo = calculator_repo(tmp_path)
    code, err, _ = fix_error(repo, capsys, "test_add", "--backend", "replay", "--replay", str(short))
    assert code == ExitCode.AGENT_ERROR and "no turn left" in err
    assert "return a - b" in (repo / "calculator.py").read_text()

    repo2 = calculator_repo(tmp_path / "second")
    code, err, _ = fix_error(
        repo2, capsys, "test_add", "--backend", "replay", "--replay", str(REPLAY), "--max-steps", "2"
    )
    assert code == ExitCode.BUDGET_EXHAUSTED and "step budget exhausted" in err


@pytest.mark.docker
def test_edits_to_test_files_are_flagged(tmp_path: Path, capsys) -> None:
    turns = [
        call("editor", command="str_replace", path="/workspace/calculator.py", old_str="return a - b\n\n\ndef subtract",
             new_str="return a + b\n\n\ndef subtract"),
        call("editor", command="insert", path="/workspace/tests/test_calculator.py", insert_line="9",
             new_str="    assert add(0, 0) == 0"),
        call("finish", summary="Fixed add and added a check."),
    ]  # fmt: skip
    replay = write_replay(tmp_path / "edits-tests.jsonl", turns)
    repo = calculator_repo(tmp_path)
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "docker", "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "WARNING     test files changed: tests/test_calculator.py" in out
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["files_changed"] == ["calculator.py", "tests/test_calculator.py"]
    assert summary["test_files_changed"] == ["tests/test_calculator.py"]


@pytest.mark.docker
def test_finishing_without_a_fix_is_not_success(tmp_path: Path, capsys) -> None:
    replay = write_replay(tmp_path / "gives-up.jsonl", [call("finish", summary="Looks fine to me.")])
    repo = calculator_repo(tmp_path)
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "docker", "--yes"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == ExitCode.FAILURE
    assert "the target does not pass: tests/test_calculator.py::test_add (failed)" in captured.err
    assert "NOT FIXED (exit 1)" in captured.out
    assert "return a - b" in (repo / "calculator.py").read_text()  # nothing applied
    (run,) = run_dirs(repo)
    assert (run / PATCH_FILE).read_text() == ""


def test_free_text_matches_test_ids() -> None:
    ids = [
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::test_divide",
        "tests/test_calc.py::test_divide_by_zero",
        "tests/test_io.py::TestParser::test_reads_numbers",
    ]
    assert match_tests("division by zero crashes", ids) == ["tests/test_calc.py::test_divide_by_zero"]
    assert match_tests("adding is broken", ids) == ["tests/test_calc.py::test_add"]
    assert match_tests("the parser", ids) == ["tests/test_io.py::TestParser::test_reads_numbers"]
    assert match_tests("quantum flux", ids) == []


def test_ctrl_c_ends_with_130_and_a_closed_trajectory(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    started = tmp_path / "started"
    replay = write_replay(tmp_path / "sleeps.jsonl", [hanging_call(started)])
    trajectory, code, out, err = interrupt_fix(repo, replay, started=started)
    assert code == ExitCode.INTERRUPTED, out + err
    assert "Traceback" not in err and "interrupted" in err
    events = read_events(trajectory)
    done, finished = events[-2:]
    assert done.type == "done" and done.outcome == "interrupted" and done.exit_code == 130
    assert finished.type == "task_finished" and finished.exit_code == 130
    summary = json.loads((trajectory.parent / SUMMARY_FILE).read_text())
    assert summary["run_id"] == trajectory.parent.name and summary["exit_code"] == 130


def test_tool_errors_are_fed_back_recorded_and_the_fix_still_lands(tmp_path: Path, capsys) -> None:
    """A malformed call, an unknown tool, invalid arguments and a tool timeout each reach the model as
    a clear error, are kept in the trajectory, and do not end the run."""
    unclosed = "<tool_call>\n<function=editor>\n<parameter=command>\nview\n"
    fix_add = call("editor", command="str_replace", path="/workspace/calculator.py",
                   old_str="    return a - b\n\n\ndef subtract", new_str="    return a + b\n\n\ndef subtract")  # fmt: skip
    turns = [
        unclosed,
        call("delete_everything", path="/"),
        call("editor", command="explode", path="/workspace/calculator.py"),
        call("shell", command="sleep 30", timeout=1),
        fix_add,
        call("finish", summary="Fixed add."),
    ]
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "errors.jsonl", turns)
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    out = capsys.readouterr()
    assert code == ExitCode.OK, out.out + out.err
    assert "Traceback" not in out.err + out.out
    assert "return a + b" in (repo / "calculator.py").read_text()
    (run,) = run_dirs(repo)
    events = read_events(run / "trajectory.jsonl")
    assert events[-1].type == "task_finished" and events[-1].exit_code == ExitCode.OK
    format_errors = [e.message for e in events if e.type == "error" and e.kind == "format"]
    assert len(format_errors) == 3 and not any(e.fatal for e in events if e.type == "error")
    assert "is not closed" in format_errors[0]
    assert "there is no tool named `delete_everything`" in format_errors[1]
    assert "invalid arguments for `editor`" in format_errors[2] and "explode" in format_errors[2]
    # Each error went back to the model as the next user message.
    user_messages = [
        e.message["content"] for e in events if e.type == "message_added" and e.message["role"] == "user"
    ]
    assert all(message in user_messages for message in format_errors)
    (timed_out,) = [e for e in events if e.type == "tool_call_finished" and e.name == "shell"]
    assert timed_out.is_error and "timed out after 1 s" in timed_out.output


def test_repeating_a_malformed_call_is_stuck_exit_7(tmp_path: Path, capsys) -> None:
    unclosed = "<tool_call>\n<function=editor>\n<parameter=command>\nview\n"
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "stuck.jsonl", [unclosed] * 6)
    code, err, events = fix_error(
        repo, capsys, "tests/test_calculator.py", "--backend", "replay", "--replay", str(replay)
    )
    assert code == ExitCode.AGENT_ERROR
    assert events[-1].report["target"] == "tests/test_calculator.py (file)"  # TARGET as a test file
    assert "clover-agent: " in err and "stuck" in err.lower()
    nudges = [e for e in events if e.type == "error" and e.kind == "stuck" and not e.fatal]
    assert len(nudges) == 1  # one nudge, then stop
    assert sum(1 for e in events if e.type == "model_responded") == 4


def test_a_fix_that_breaks_another_test_is_not_success(tmp_path: Path, capsys) -> None:
    breaks_subtract = call("editor", command="str_replace", path="/workspace/calculator.py",
                           old_str="    return a - b\n", new_str="    return a + b\n", replace_all="true")  # fmt: skip
    replay = write_replay(tmp_path / "breaks.jsonl", [breaks_subtract, call("finish", summary="Fixed add.")])
    repo = calculator_repo(tmp_path)
    code, err, events = fix_error(repo, capsys, "test_add", "--backend", "replay", "--replay", str(replay))
    assert code == ExitCode.FAILURE
    assert "tests that passed before do not: tests/test_calculator.py::test_subtract (failed)" in err
    assert "return a - b" in (repo / "calculator.py").read_text()  # not applied
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["regressions"] == ["tests/test_calculator.py::test_subtract"]
    assert summary["tests"]["target_after"]["passed"] == 1 and not summary["fixed"]
    runs = [e for e in events if e.type == "tests_run"]
    # the test that broke is run once more (a flaky one would pass): it fails again, a regression
    assert [e.phase for e in runs][-3:] == ["target_after", "suite_after", "suite_rerun"]
    assert runs[-1].report["outcomes"] == {"tests/test_calculator.py::test_subtract": "failed"}


def _turns(replay: Path) -> list[str]:
    return [json.loads(line)["content"] for line in replay.read_text().splitlines() if line.strip()]


def test_yes_merges_the_fix_with_edits_made_to_the_same_file_meanwhile(tmp_path: Path, capsys) -> None:
    """The person edits the file the agent fixes while the run works (here: the replay's shell turn,
    run on this machine by the local sandbox, stands in for them): --yes merges the fix into their
    file, their edit stays, and the summary says the merged file was not what the tests ran."""
    repo = calculator_repo(tmp_path)
    meanwhile = call("shell", command=f"printf '\\n# my own work\\n' >> {repo}/calculator.py")
    replay = write_replay(tmp_path / "meanwhile.jsonl", [meanwhile, *_turns(REPLAY)])
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.out + captured.err
    assert "Traceback" not in captured.err
    text = (repo / "calculator.py").read_text()
    assert text.endswith("# my own work\n") and "return a + b" in text  # yours and the fix
    assert "calculator.py: merged with your edits" in captured.out and "not run" in captured.out
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["fixed"] and "merged with your edits: calculator.py" in summary["hand_back"]


def test_a_hand_back_that_fails_is_headed_not_applied(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    gone = call("shell", command=f"rm {repo}/calculator.py")  # the person removes the file meanwhile
    replay = write_replay(tmp_path / "gone.jsonl", [gone, *_turns(REPLAY)])
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "local", "--yes"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == ExitCode.FAILURE and "calculator.py: you removed it since" in captured.err
    out = captured.out
    assert "clover-agent fix: FIXED" in out and "clover-agent fix: FIXED, NOT APPLIED (exit 1)" in out


#: A test that kills the local sandbox's runner (its ancestor process whose last argument is the
#: sandbox mode): the sandbox breaks while the suite runs.
KILL_THE_RUNNER = """import os, signal


def test_kills_the_sandbox():
    pid = os.getppid()
    while pid > 1:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")  # it ends with a NUL
        if b"-I" in argv and argv[-2:] == [b"local", b""]:
            os.kill(pid, signal.SIGKILL)
            return
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no sandbox runner above this test")
"""


def test_a_sandbox_that_breaks_during_the_baseline_keeps_the_target_run(tmp_path: Path, capsys) -> None:
    """The target's run before the change is in summary.json although the sandbox died in the
    regression baseline after it (the suite holds a test that kills the sandbox's runner)."""
    repo = calculator_repo(tmp_path)
    (repo / "tests" / "test_zz_breaks.py").write_text(KILL_THE_RUNNER)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a test that breaks the sandbox")
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(REPLAY),
                 "--sandbox", "local"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.SANDBOX_UNAVAILABLE, err
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["exit_code"] == code
    assert summary["tests"]["target_before"]["failed"] == 1, summary["tests"]
    assert summary["tests"]["suite_before"] is None, summary["tests"]
    assert "return a - b" in (repo / "calculator.py").read_text()
