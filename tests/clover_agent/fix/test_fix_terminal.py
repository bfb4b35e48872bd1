"""``clover-agent fix`` as a person sees it: a live status line while a slow model streams (a real
pseudo-terminal and a local OpenAI-compatible server), plain text without colour or a terminal,
each error said once, the early warning about uncommitted files, the diff at the confirmation,
an approval answered "always" that is not asked again.

The server streams the recorded turns of examples/calculator-fix.replay.jsonl (the reasoning as
``reasoning_content``), so the agent really fixes the example through the openai backend.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clover_agent.agent.trajectory import TRAJECTORY_FILE, read_events
from clover_agent.cli.handback import hand_back
from clover_agent.errors import ExitCode
from clover_agent.events import TaskResumed
from clover_agent.fix.console import make_console
from tests.cli_process import run_at_a_terminal
from tests.clover_agent.fix.stocked import stocked_report, verifier
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo, run_dirs
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.clover_agent.test_backend_openai import ChatServer, _chunk
from tests.git_repos import git

pytestmark = pytest.mark.slow
SGR = re.compile(r"\x1b\[[0-9;]*m")  # a style (colour, bold, dim)
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a style or a cursor move
#: No colour switches from the test's own environment: each test says what it wants.
NEUTRAL = {"NO_COLOR": "", "FORCE_COLOR": "", "PYTHONUNBUFFERED": "1"}


def replay_replies(path: Path, *, pause: float = 0.0, slow: int = 0, piece: int = 6) -> list[dict[str, Any]]:
    """The turns of a replay file as streamed chat completions, ``piece`` characters a chunk: the
    first ``slow`` turns with ``pause`` seconds between chunks (a slow model), the rest at once."""
    replies = []
    for number, line in enumerate(path.read_text().splitlines()):
        content = json.loads(line)["content"]
        reasoning = ""
        if content.startswith("<think>"):
            reasoning, content = content.removeprefix("<think>").split("</think>", 1)
        chunks = [
            _chunk({"reasoning_content": reasoning[i : i + piece]}) for i in range(0, len(reasoning), piece)
        ]
        chunks += [_chunk({"content": content[i : i + piece]}) for i in range(0, len(content), piece)]
        chunks += [_chunk({}, finish="stop"), "[DONE]"]
        replies.append({"sse": chunks, "pause": pause if number < slow else 0.0})
    return replies


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    yield chat
    chat.close()


def fix_command(repo: Path, *more: str) -> list[str]:
    return ["fix", "test_add", "--repo", str(repo), "--sandbox", "local", *more]


def run_piped(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``clover-agent ARGS`` with stdout and stderr on one pipe (in the order written), no terminal."""
    return subprocess.run(
        [sys.executable, "-m", "clover_agent", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
        env={**os.environ, **NEUTRAL, **(env or {})},
    )  # fmt: skip


def test_a_slow_model_shows_a_live_status_line_then_the_final_figures(
    tmp_path: Path, server: ChatServer
) -> None:
    repo = calculator_repo(tmp_path)
    server.replies.extend(replay_replies(REPLAY, pause=0.15, slow=1))  # the first turn takes ~6 s
    # --base-url alone selects the openai backend.
    code, shown = run_at_a_terminal(fix_command(repo, "--base-url", server.base_url, "--yes"), env=NEUTRAL)
    assert code == ExitCode.OK, shown[-3000:]
    assert SGR.search(shown), "no styles at a colour terminal"
    text = ESCAPE.sub("", shown)
    first_call = text.index("→ run_tests")
    before = text[:first_call]
    # The status line was redrawn while the model streamed, before the first tool call: its
    # elapsed time and its count of written tokens moved on.
    elapsed = re.findall(r"model (?:thinking|writing) \((\d+\.\d) s\) · step 1/50 · ", before)
    written = re.findall(r"step 1/50 · [^·]+ · [\d,]+ in / ([\d,]+) out tokens", before)
    assert len(set(elapsed)) >= 3 and len({int(n.replace(",", "")) for n in written}) >= 3, before[-2000:]
    assert "thinking │ The task names test_add." in text  # the thinking, labelled, folded to a line
    # The final figures: model calls, tokens in and out, the rate.
    assert re.search(
        r"agent       submitted; 5 model calls; [\d,]+ tokens in, [1-9][\d,]* out \([\d,]+ tok/s over ", text
    ), text[-1500:]
    assert "clover-agent fix: FIXED" in text and "Applied to" in text
    assert "return a + b" in (repo / "calculator.py").read_text()


def test_no_color_at_a_terminal_and_a_pipe_give_plain_text(tmp_path: Path, server: ChatServer) -> None:
    repo = calculator_repo(tmp_path)
    server.replies.extend(replay_replies(REPLAY))
    code, shown = run_at_a_terminal(
        fix_command(repo, "--base-url", server.base_url, "--dry-run"), env={**NEUTRAL, "NO_COLOR": "1"}
    )
    assert code == ExitCode.OK, shown[-3000:]
    assert not SGR.search(shown), "NO_COLOR: no colour or other style"
    assert "clover-agent fix: FIXED" in shown and "thinking │" in shown

    piped_repo = calculator_repo(tmp_path / "piped")
    server.replies.extend(replay_replies(REPLAY))
    done = run_piped(fix_command(piped_repo, "--base-url", server.base_url, "--dry-run"))
    assert done.returncode == ExitCode.OK, done.stdout[-3000:]
    assert "\x1b" not in done.stdout, "not a terminal: no escape sequences at all"
    # Plain lines instead of the live area: each phase, and each model call's figures.
    assert "… tests before: the regression baseline: the whole suite" in done.stdout
    assert re.search(r"^  step 1: [\d,]+ tokens out in \d+\.\d s.*; prompt [\d,]+ tokens$", done.stdout, re.M)
    assert re.search(r"^  agent       submitted; 5 model calls; ", done.stdout, re.M)


def test_an_error_is_said_once_and_the_printed_resume_command_works_as_pasted(tmp_path: Path) -> None:
    """Replay backend: a run stopped on its step budget, then the command it printed, pasted."""
    repo = calculator_repo(tmp_path)
    first = run_piped(fix_command(repo, "--replay", str(REPLAY), "--max-steps", "3"))
    assert first.returncode == ExitCode.BUDGET_EXHAUSTED, first.stdout[-3000:]
    assert "Traceback" not in first.stdout
    assert first.stdout.count("step budget exhausted") == 1, first.stdout  # said once, at the end
    resume = resumed_ok(first.stdout, repo)
    assert "--backend replay" in resume.stdout and f"--replay {REPLAY}" in resume.stdout


def resumed_ok(output: str, repo: Path) -> subprocess.CompletedProcess[str]:
    """Run the ``continue it with: clover-agent fix --resume ...`` command ``output`` printed, as
    pasted into a shell (no terminal to confirm: the patch is kept, not applied)."""
    (line,) = [x for x in output.splitlines() if x.startswith("continue it with: clover-agent ")]
    words = shlex.split(line.removeprefix("continue it with: clover-agent "))
    done = run_piped(words)
    assert done.returncode == ExitCode.OK, done.stdout[-3000:]
    assert "clover-agent fix: FIXED" in done.stdout and "resuming with the options run" in done.stdout
    (run,) = run_dirs(repo)
    assert "+    return a + b" in (run / "patch.diff").read_text()
    return done


def _asked(server: ChatServer) -> list[dict]:
    """The chat requests (not the checks of the served models before any work)."""
    return [r for r in server.requests if r["path"].endswith("/chat/completions")]


def test_the_printed_resume_command_works_for_an_openai_run(tmp_path: Path, server: ChatServer) -> None:
    repo = calculator_repo(tmp_path)
    server.replies.extend(replay_replies(REPLAY))
    first = run_piped(fix_command(repo, "--base-url", server.base_url, "--max-steps", "3"))
    assert first.returncode == ExitCode.BUDGET_EXHAUSTED, first.stdout[-3000:]
    resume = resumed_ok(first.stdout, repo)
    assert f"--backend openai --base-url {server.base_url}" in resume.stdout
    assert len(_asked(server)) == 5 and not server.replies  # each turn asked for once


def test_the_printed_resume_command_asks_the_server_clover_base_url_named(
    tmp_path: Path, server: ChatServer
) -> None:
    """The server came from the environment, not a flag: the command works pasted where it is not set."""
    repo = calculator_repo(tmp_path)
    server.replies.extend(replay_replies(REPLAY))
    first = run_piped(fix_command(repo, "--backend", "openai", "--max-steps", "3"),
                      env={"CLOVER_BASE_URL": server.base_url})  # fmt: skip
    assert first.returncode == ExitCode.BUDGET_EXHAUSTED, first.stdout[-3000:]
    resume = resumed_ok(first.stdout, repo)  # run_piped: this test process has no CLOVER_BASE_URL
    assert f"--backend openai --base-url {server.base_url}" in resume.stdout
    assert len(_asked(server)) == 5 and not server.replies


def test_uncommitted_files_are_named_before_any_work(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    (repo / "calculator.py").write_text((repo / "calculator.py").read_text() + "\n# my own work\n")
    done = run_piped(fix_command(repo, "--replay", str(REPLAY), "--yes"))
    note = done.stdout.find("note: uncommitted changes in calculator.py.")
    assert 0 <= note < done.stdout.index("tests target before"), done.stdout[:2000]
    # The patch touches that file: the agent worked on top of the person's changes, which stay.
    assert done.returncode == ExitCode.OK, done.stdout[-2000:]
    text = (repo / "calculator.py").read_text()
    assert text.endswith("# my own work\n") and "return a + b" in text


def test_the_confirmation_shows_the_diff_then_asks(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    code, shown = run_at_a_terminal(
        fix_command(repo, "--replay", str(REPLAY)), env=NEUTRAL, answers=[("[N] no: ", "y\n")]
    )
    assert code == ExitCode.OK, shown[-3000:]
    text = ESCAPE.sub("", shown)
    question = text.index("The patch changes 1 file(s)")
    assert text.rindex("-    return a - b", 0, question) < text.rindex("+    return a + b", 0, question)
    assert "modified     calculator.py" in text[question:] and "Applied to" in text[question:]
    assert git(repo, "diff", "--stat").strip().startswith("calculator.py")


def test_the_printed_resume_command_works_for_an_engine_run(tmp_path: Path) -> None:
    """A tiny random checkpoint (its text is noise): the run stops on its time budget in a model
    call; the printed command resumes it with the same backend, model and budget."""
    from clover_agent.engine.loading.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint(
        tmp_path / "ckpt", peaked=True, seed=5, overrides={"max_position_embeddings": 32768}
    )
    repo = calculator_repo(tmp_path)
    first = run_piped(fix_command(repo, "--model", str(model), "--max-time", "8"))  # --model: the engine
    assert first.returncode == ExitCode.BUDGET_EXHAUSTED, first.stdout[-3000:]
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("continue it with: clover-agent ")]
    again = run_piped(shlex.split(line.removeprefix("continue it with: clover-agent ")))
    assert again.returncode == ExitCode.BUDGET_EXHAUSTED, again.stdout[-3000:]  # the recorded budget
    assert f"--backend engine --model {model.resolve()}" in again.stdout and "--max-time 8" in again.stdout
    for output in (first.stdout, again.stdout):
        assert "Traceback" not in output and "terminate called" not in output
    (run,) = run_dirs(repo)
    resumed = [e for e in read_events(run / TRAJECTORY_FILE) if isinstance(e, TaskResumed)]
    assert [e.launch["backend"] for e in resumed] == ["engine"]


async def test_files_can_be_chosen_one_by_one_after_a_paged_diff(
    tmp_path: Path, capfd, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = calculator_repo(tmp_path)
    (repo / "notes.txt").write_text("notes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "notes")
    report = await stocked_report(
        repo,
        repo / ".clover" / "runs" / "r1",
        "sed -i '0,/a - b/s//a + b/' calculator.py && echo more >> notes.txt",
    )
    asked: list[str] = []
    answers = iter(["f", "y", "n"])  # choose files: calculator.py yes, notes.txt no

    def ask(question: str) -> str:
        asked.append(question)
        return next(answers)

    main_fd, terminal_fd = pty.openpty()
    with os.fdopen(terminal_fd, "r") as terminal:
        monkeypatch.setattr(sys, "stdin", terminal)  # a terminal to answer at
        console = make_console(environ={"LINES": "5", "COLUMNS": "100"})  # a diff longer than the screen
        code = hand_back(report, repo, argparse.Namespace(yes=False, dry_run=False), console,
                         environ={"PAGER": "cat"}, ask=ask, reverify=verifier(repo, report))  # fmt: skip
    os.close(main_fd)
    assert code == ExitCode.OK
    out = capfd.readouterr().out
    assert "+    return a + b" in out and "+more" in out  # the diff, through the pager
    assert "Verifying the files to apply on their own, without notes.txt" in out
    assert "[f] choose files" in asked[0] and "modified     calculator.py" in asked[0]
    assert asked[1:] == ["  apply calculator.py (+1 -1)? [y/N] ", "  apply notes.txt (+1 -0)? [y/N] "]
    assert "return a + b" in (repo / "calculator.py").read_text()
    assert (repo / "notes.txt").read_text() == "notes\n"
    assert "Not applied: notes.txt." in out
    summary = json.loads((report.run_dir / "summary.json").read_text())
    assert summary["hand_back"] == "applied: calculator.py; not applied: notes.txt"
    # the part applied was verified on its own: its verdict is the run's
    assert summary["subset"] == {"files": ["calculator.py"], "whole_patch_verdict": "fixed"}
    assert summary["verdict"] == "fixed" and summary["tests"]["target_after"]["passed"] == 1


def requested_scope(runs: list[Path]) -> str:
    """What the run's one approval question said an "always" would allow (its trajectory's word)."""
    (run,) = runs
    (requested,) = [e for e in read_events(run / TRAJECTORY_FILE) if e.type == "approval_requested"]
    assert requested.always
    return requested.always


def test_an_approval_answered_always_is_not_asked_again_in_the_run(tmp_path: Path) -> None:
    """Policy workspace asks about a command that mentions curl; answered "always" at the terminal,
    the same command later in the run runs without a question. The replay then fixes the example."""
    repo = calculator_repo(tmp_path)
    asks = call("shell", command="echo curl is mentioned, not run")
    replay = write_replay(tmp_path / "asks.jsonl", [asks, asks, *(json.loads(t)["content"] for t in
                                                                 REPLAY.read_text().splitlines())])  # fmt: skip
    question = "Allow it? [y] once / [a] always for this run / [N] no, or type what to do instead: "
    # A second question would be answered no (and the run would show it): it must not come.
    code, shown = run_at_a_terminal(
        fix_command(repo, "--replay", str(replay), "--policy", "workspace", "--yes"),
        env={**NEUTRAL, "NO_COLOR": "1"},
        answers=[(question, "a\n"), (question, "n\n")],
    )
    assert code == ExitCode.OK, shown[-3000:]
    text = ESCAPE.sub("", shown)
    assert text.count(question) == 1, text[-3000:]
    assert "The agent wants to run shell command=echo curl is mentioned, not run" in text
    assert f"[a] always allows {requested_scope(run_dirs(repo))}." in text
    assert "policy: shell allowed by you, answered always (policy 'workspace'" in text
    assert 'policy: shell allowed by your "always" earlier in this run' in text
    assert "clover-agent fix: FIXED" in text and "return a + b" in (repo / "calculator.py").read_text()
    (run,) = run_dirs(repo)
    events = read_events(run / TRAJECTORY_FILE)
    (requested,) = [e for e in events if e.type == "approval_requested"]
    decided = [e for e in events if e.type == "approval_decided"]
    assert [(e.approved, e.decided_by, e.answer) for e in decided] == [
        (True, "user", "always"),
        (True, "remembered", None),
    ]
    assert decided[0].call_id == requested.call_id and "*curl *" in decided[0].reason
    ran = [e for e in events if e.type == "tool_call_finished" and e.name == "shell"]
    assert [e.call_id for e in ran] == [e.call_id for e in decided]  # both calls ran, in order
    assert all(not e.is_error and "curl is mentioned, not run" in e.output for e in ran)
