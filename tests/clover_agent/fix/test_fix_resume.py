"""``clover-agent fix --resume``: a stopped run continues in a fresh sandbox and ends like any fix.

Real git repositories (copies of examples/calculator), real sandboxes and pytest runs; the replay
backend stands in for the model (recorded turns, not a model), each segment reading its own file.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from clover_agent.agent import load_trajectory
from clover_agent.agent.notes import INTERRUPTED_CALL
from clover_agent.agent.trajectory import TRAJECTORY_FILE, read_events
from clover_agent.cli import main
from clover_agent.cli.options import record_key
from clover_agent.errors import ExitCode
from clover_agent.fix.runs import PATCH_FILE, RECORD_FILES, SUMMARY_FILE
from clover_agent.settings import Settings
from tests.clover_agent.fix.test_fix import (
    REPLAY,
    calculator_repo,
    hanging_call,
    interrupt_fix,
    run_dirs,
    suite_passes,
)
from tests.clover_agent.test_agent_loop import call, write_replay

pytestmark = pytest.mark.slow

#: The recorded calculator fix: run the test, view the file, fix `add`, run the suite, finish.
TURNS = REPLAY.read_text().splitlines()
FIX_ADD = call("editor", command="str_replace", path="/workspace/calculator.py",
               old_str="    return a - b\n\n\ndef subtract", new_str="    return a + b\n\n\ndef subtract")  # fmt: skip


def signed_as_yours(run: Path, repo: Path) -> None:
    """Sign a run folder's records with the test's user key, as clover-agent signs what it writes."""
    key = record_key(Settings.load(), repo)
    for name in RECORD_FILES:
        if (run / name).is_file():
            key.sign(run, name)


def replay_file(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def fix(repo: Path, capsys, *args: str, sandbox: str = "local") -> tuple[int, str, str]:
    code = main(["fix", *args, "--repo", str(repo), "--backend", "replay", "--sandbox", sandbox, "--yes"])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out, out.err


def stopped_on_the_step_budget(tmp_path: Path, capsys) -> tuple[Path, Path]:
    """A run that stopped (exit 6) after the first two recorded turns: the fix not yet made."""
    repo = calculator_repo(tmp_path)
    code, _, err = fix(repo, capsys, "test_add", "--replay", str(REPLAY), "--max-steps", "2")
    assert code == ExitCode.BUDGET_EXHAUSTED and "step budget exhausted" in err
    (run,) = run_dirs(repo)
    assert f"continue it with: clover-agent fix --resume {run.name} --repo {repo}" in err
    return repo, run


def test_a_run_stopped_on_its_step_budget_resumes_to_a_fix(tmp_path: Path, capsys) -> None:
    repo, run = stopped_on_the_step_budget(tmp_path, capsys)
    assert "return a - b" in (repo / "calculator.py").read_text()
    before = read_events(run / TRAJECTORY_FILE)
    messages_at_stop = sum(e.type == "message_added" for e in before)

    rest = replay_file(tmp_path / "rest.jsonl", TURNS[2:])
    # --max-steps 3 is exactly the turns left: the budget is the new invocation's, not what remains
    # of the old one (2 of 3 would already be spent).
    code, out, err = fix(repo, capsys, "--resume", run.name, "--replay", str(rest), "--max-steps", "3")
    assert code == ExitCode.OK, out + err
    assert f"resumes run {run.name} (segment 2)" in out and "budget_exhausted, exit 6" in out
    assert "FIXED" in out and "Applied to" in out
    assert "  before      target: 0 passed, 1 failed; suite: 4 passed, 1 failed\n" in out  # the baseline
    assert "  after       target: 1 passed, 0 failed; suite: 5 passed, 0 failed\n" in out
    assert "return a + b" in (repo / "calculator.py").read_text() and suite_passes(repo)
    assert run_dirs(repo) == [run]  # no new run folder
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert (
        summary["fixed"]
        and summary["hand_back"] == "applied"
        and summary["files_changed"] == ["calculator.py"]
    )
    assert summary["agent"]["steps"] == 5  # both segments
    assert "+    return a + b" in (run / PATCH_FILE).read_text()

    # One trajectory, both segments in order, the boundary marked with why the first one stopped.
    events = read_events(run / TRAJECTORY_FILE)
    assert events[: len(before)] == before  # appended, not rewritten
    kinds = [e.type for e in events]
    boundary = kinds.index("task_resumed")
    assert boundary == len(before) and kinds.count("task_started") == 1
    # After the boundary the agent goes on at once: no tests before again (phases are not events
    # of the agent).
    after = [k for k in kinds[boundary + 1 :] if k != "phase_started"]
    assert kinds[:boundary].count("run_started") == 1 and after[0] == "run_started"
    resumed = events[boundary]
    assert (resumed.segment, resumed.previous_exit_code, resumed.previous_outcome) == (
        2,
        6,
        "budget_exhausted",
    )
    assert "step budget exhausted" in resumed.previous_message
    assert next(e for e in events[boundary:] if e.type == "run_started").resumed
    assert [e.outcome for e in events if e.type == "done"] == ["budget_exhausted", "submitted"]
    # The first segment's end; the second's verdict, then the command's outcome once handed back.
    assert [e.exit_code for e in events if e.type == "task_finished"] == [6, 0, 0]
    assert [e.phase for e in events if e.type == "tests_run"] == [
        "target_before", "suite_before", "target_after", "suite_after",
    ]  # fmt: skip

    # The model was given the earlier turns on resuming: the conversation continued where it stopped.
    responded = [e for e in events if e.type == "model_responded"]
    assert [e.step for e in responded] == [1, 2, 3, 4, 5]
    assert responded[2].prompt_messages == messages_at_stop == 6  # system, task, 2 x (call, result)
    assert responded[2].prompt_tokens > responded[1].prompt_tokens
    state = load_trajectory(run / TRAJECTORY_FILE)
    assert state.steps == 5 and state.last_outcome == "submitted"
    assert [m["role"] for m in state.messages[:6]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]


def test_an_interrupted_run_resumes_from_its_last_change(tmp_path: Path, capsys) -> None:
    """Ctrl-C while a call runs: the sandbox is gone before the final diff can be read, yet the
    edit made before it is restored, and the cut-off call gets a result saying what happened."""
    repo = calculator_repo(tmp_path)
    started = tmp_path / "started"
    replay = write_replay(tmp_path / "edit-then-hang.jsonl", [FIX_ADD, hanging_call(started)])
    _, code, out, err = interrupt_fix(repo, replay, started=started)
    assert code == ExitCode.INTERRUPTED, out + err
    (run,) = run_dirs(repo)
    assert "Traceback" not in err
    assert f"interrupted; continue it with: clover-agent fix --resume {run.name} --repo {repo}" in err
    assert [e.type for e in read_events(run / TRAJECTORY_FILE)].count("workspace_changed") == 1

    finish = write_replay(tmp_path / "finish.jsonl", [call("finish", summary="Fixed add.")])
    code, out, err = fix(repo, capsys, "test_add", "--resume", "last", "--replay", str(finish))
    assert code == ExitCode.OK, out + err
    assert "interrupted, exit 130" in out
    assert "return a + b" in (repo / "calculator.py").read_text() and suite_passes(repo)
    events = read_events(run / TRAJECTORY_FILE)
    boundary = [e.type for e in events].index("task_resumed")
    answered, finished = [
        e.message for e in events[boundary:] if e.type == "message_added" and e.message["role"] == "tool"
    ]
    assert answered["name"] == "shell" and answered["content"] == INTERRUPTED_CALL
    last_call = [e.message for e in events[:boundary] if e.type == "message_added"][-1]
    assert answered["tool_call_id"] == last_call["tool_calls"][0]["id"] and finished["name"] == "finish"


@pytest.mark.docker
def test_a_run_stopped_locally_resumes_in_docker(tmp_path: Path, capsys) -> None:
    repo, run = stopped_on_the_step_budget(tmp_path, capsys)
    rest = replay_file(tmp_path / "rest.jsonl", TURNS[2:])
    # Options given now replace the recorded ones (--max-steps 2, the local sandbox).
    code, out, err = fix(
        repo, capsys, "--resume", str(run), "--replay", str(rest), "--max-steps", "3", sandbox="docker"
    )
    assert code == ExitCode.OK, out + err
    assert "(docker sandbox)" in out and "return a + b" in (repo / "calculator.py").read_text()
    assert [e.sandbox for e in read_events(run / TRAJECTORY_FILE) if e.type == "task_resumed"] == ["docker"]


def test_runs_that_cannot_be_resumed_are_refused_clearly(tmp_path: Path, capsys) -> None:
    repo, run = stopped_on_the_step_budget(tmp_path, capsys)
    rest = str(replay_file(tmp_path / "rest.jsonl", TURNS[2:]))
    recorded = (run / TRAJECTORY_FILE).read_text()

    def refused(*args: str) -> str:
        code, _, err = fix(repo, capsys, *args, "--replay", rest)
        assert code == ExitCode.USAGE, err
        return err

    err = refused("--resume", "20200101-000000-abcdef")
    assert "no such run under" in err and run.name in err  # names the runs there are
    assert "differs from the target" in refused("test_subtract", "--resume", run.name)
    assert "needs a TARGET" in refused()
    assert "no run folder there" in refused("--resume", str(tmp_path / "nowhere"))

    # A damaged or copied record is not what this user's clover-agent signed: nothing of it is read.
    damaged = run.parent / "20200101-000000-damage"
    shutil.copytree(run, damaged)
    lines = recorded.splitlines(keepends=True)
    lines[3] = '{"type": "tests_run", "time": 1, "phase": "suite_bef\n'
    (damaged / TRAJECTORY_FILE).write_text("".join(lines))
    err = refused("--resume", damaged.name)
    assert f"run {damaged.name} in {damaged} was not written by your clover-agent" in err
    assert f"{TRAJECTORY_FILE} is not what this user's clover-agent wrote" in err
    # Signed as it is (damaged on disk after clover-agent wrote it): the damage is named.
    signed_as_yours(damaged, repo)
    err = refused("--resume", damaged.name)
    assert "the trajectory is damaged" in err and f"{TRAJECTORY_FILE}:4: not valid JSON" in err
    lines[3] = '{"type": "no_such_event", "time": 1}\n'
    (damaged / TRAJECTORY_FILE).write_text("".join(lines))
    signed_as_yours(damaged, repo)
    assert f"{TRAJECTORY_FILE}:4: not a trajectory event" in refused("--resume", damaged.name)
    shutil.rmtree(damaged)

    assert (run / TRAJECTORY_FILE).read_text() == recorded  # refusals leave the run alone
    code, out, err = fix(repo, capsys, "--resume", run.name, "--replay", rest, "--max-steps", "3")
    assert code == ExitCode.OK, out + err
    err = refused("--resume", run.name)
    assert f"run {run.name} already finished successfully" in err and PATCH_FILE in err


def test_a_run_that_never_reached_the_agent_is_not_resumed(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code, _, err = fix(repo, capsys, "test_subtract", "--replay", str(REPLAY))
    assert code == ExitCode.NOTHING_TO_FIX and "--resume" not in err  # nothing to continue
    code, _, err = fix(repo, capsys, "--resume", "last", "--replay", str(REPLAY))
    assert code == ExitCode.USAGE and "stopped before the agent started" in err and "nothing to fix" in err


def test_a_resumption_that_fails_to_start_keeps_the_run_resumable(tmp_path: Path, capsys) -> None:
    """A resumption whose sandbox cannot start (exit 4) records its verdict but not an empty
    workspace: the next resumption still starts from the change the first segment made."""
    repo = calculator_repo(tmp_path)
    code, _, _ = fix(repo, capsys, "test_add", "--replay", str(REPLAY), "--max-steps", "3")
    assert code == ExitCode.BUDGET_EXHAUSTED  # after the third turn: `add` fixed in the sandbox
    (run,) = run_dirs(repo)
    rest = str(replay_file(tmp_path / "rest.jsonl", TURNS[3:]))

    code, _, err = fix(repo, capsys, "--resume", run.name, "--replay", rest, "--image", "clover-no-such-image:0",
                       sandbox="docker")  # fmt: skip
    assert code == ExitCode.SANDBOX_UNAVAILABLE, err
    assert f"--resume {run.name}" in err
    assert "+    return a + b" in load_trajectory(run / TRAJECTORY_FILE).patch

    code, out, err = fix(repo, capsys, "--resume", run.name, "--replay", rest)
    assert code == ExitCode.OK, out + err
    assert "segment 3" in out and "exit 4" in out
    assert "return a + b" in (repo / "calculator.py").read_text() and suite_passes(repo)


def pasted(err: str, capsys) -> tuple[int, str, str]:
    """The ``continue it with: clover-agent fix --resume ...`` command ``err`` printed, run as
    printed (in this process: no terminal, so the patch is applied only if it says --yes)."""
    (line,) = [x for x in err.splitlines() if "continue it with: clover-agent " in x]
    words = shlex.split(line.split("continue it with: clover-agent ", 1)[1])
    code = main(words)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out, out.err


def test_a_resumption_takes_the_recorded_regression_scope_suite_timeout_and_wheels(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = calculator_repo(tmp_path)
    (tmp_path / "wheels").mkdir()
    monkeypatch.chdir(tmp_path)  # --wheels relative to where the run was started
    code, _, err = fix(repo, capsys, "test_add", "--replay", str(REPLAY), "--max-steps", "2",
                       "--regression", "related", "--suite-timeout", "321", "--wheels", "wheels")  # fmt: skip
    assert code == ExitCode.BUDGET_EXHAUSTED, err
    (run,) = run_dirs(repo)
    (started,) = [e for e in read_events(run / TRAJECTORY_FILE) if e.type == "task_started"]
    assert started.launch["regression"] == "related" and started.launch["suite_timeout"] == 321
    assert started.launch["wheels"] == str(tmp_path / "wheels")

    monkeypatch.chdir(repo)  # resumed from elsewhere
    rest = replay_file(tmp_path / "rest.jsonl", TURNS[2:])
    # A scope other than the baseline's is refused; the recorded one is taken without a flag.
    code, _, err = fix(repo, capsys, "--resume", run.name, "--replay", str(rest), "--regression", "none")
    assert code == ExitCode.USAGE and "measured its regression baseline with --regression related" in err
    code, out, err = fix(repo, capsys, "--resume", run.name, "--replay", str(rest), "--max-steps", "3",
                         "--suite-timeout", "400")  # fmt: skip
    assert code == ExitCode.OK, out + err
    taken = out[out.index("resuming with the options") :].splitlines()[0]
    assert "--wheels " + str(tmp_path / "wheels") in taken and "--regression related" in taken
    assert "--suite-timeout" not in taken  # given now: the flag wins
    assert "related test file(s) checked (--regression related)" in out
    (resumed,) = [e for e in read_events(run / TRAJECTORY_FILE) if e.type == "task_resumed"]
    assert resumed.launch["regression"] == "related" and resumed.launch["suite_timeout"] == 400
    assert resumed.launch["wheels"] == str(tmp_path / "wheels")


def test_the_printed_command_continues_a_replay_given_on_resuming_and_repeats_yes(
    tmp_path: Path, capsys
) -> None:
    """Segment 2 plays another file for one turn; the command it prints, pasted, goes on with that
    file after that turn (not after all the run's turns), and so does the next one, which applies
    the patch, as --yes asked."""
    repo, run = stopped_on_the_step_budget(tmp_path, capsys)
    rest = replay_file(tmp_path / "rest.jsonl", TURNS[2:])
    code, _, err = fix(repo, capsys, "--resume", run.name, "--replay", str(rest), "--max-steps", "1")
    assert code == ExitCode.BUDGET_EXHAUSTED, err
    # The sandbox without isolation is never taken from the record: the command repeats it.
    assert f"--resume {run.name} --repo {repo} --sandbox local --yes\n" in err + "\n"
    code, out, err = pasted(err, capsys)  # the recorded budget: one turn, the suite run
    assert code == ExitCode.BUDGET_EXHAUSTED and "5 passed, 0 failed" in out, out + err
    code, out, err = pasted(err, capsys)  # the last turn: finish
    assert code == ExitCode.OK, out + err
    assert f"--backend replay --replay {rest}" in out and "(local sandbox)" in out
    assert "FIXED" in out and "Applied to" in out and "return a + b" in (repo / "calculator.py").read_text()
    events = read_events(run / TRAJECTORY_FILE)
    assert [e.launch["replay_start"] for e in events if e.type == "task_resumed"] == [0, 1, 2]
    assert [e.step for e in events if e.type == "model_responded"] == [1, 2, 3, 4, 5]
