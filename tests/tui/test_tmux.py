"""The TUI in a real terminal: tmux at 100x30 and 80x24 runs ``clover-agent tui`` from a shell;
a typed request runs (replay backend, local sandbox), its tool calls and result show, and ctrl+c
twice or ctrl+q quits (first saying which changes are not applied, then printing how to resume),
leaving the shell as it was (same terminal settings, commands run); ctrl+c
clears a draft and interrupts a request, and Tab leaves the focus in the prompt; after PageUp new
output does not pull the view down, and back at the bottom it follows again; a shell command's
output shows in its card while it runs."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]
CLI = Path(sys.executable).with_name("clover-agent")


class Tmux:
    """One tmux server of its own (``-L``) with one window running bash."""

    def __init__(self, width: int, height: int, cwd: Path) -> None:
        self.socket = f"clover-tui-{uuid.uuid4().hex[:8]}"
        self.run(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            str(width),
            "-y",
            str(height),
            "-c",
            str(cwd),
            "env PS1='$ ' TERM=xterm-256color bash --norc --noprofile",
        )

    def run(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True
        ).stdout

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "t", "-l", text)

    def key(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def wait(self, *texts: str, deadline_s: float = 120.0) -> str:
        end = time.monotonic() + deadline_s
        while True:
            shown = self.screen()
            if all(t in shown for t in texts):
                return shown
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {texts!r}; the screen:\n{shown}")
            time.sleep(0.2)

    def start_tui(self, replay: Path) -> None:
        """``clover-agent tui`` on ``replay`` in the local sandbox, then wait until it is ready
        (``EXIT=`` follows its exit status when it quits)."""
        command = [str(CLI), "tui", "--backend", "replay", "--replay", str(replay), "--sandbox", "local"]
        self.type(shlex.join(command) + "; echo EXIT=$?")
        self.key("Enter")
        self.wait("Ask for a change", "local ready")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], check=False, capture_output=True)


@pytest.mark.parametrize(("size", "quit_key"), [((100, 30), "C-c"), ((80, 24), "C-q")])
def test_in_a_real_terminal(tmp_path: Path, size: tuple[int, int], quit_key: str) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "fix.jsonl",
        [
            turn("Reading the code.", call("editor", command="view", path="/workspace/calculator.py")),
            turn("Fixing add.", FIX_ADD),
            turn("", call("finish", summary="add returns a + b now")),
        ],
    )
    tmux = Tmux(*size, cwd=repo)
    try:
        tmux.type("stty -g > ../before.txt; clear")
        tmux.key("Enter")
        tmux.start_tui(replay)

        tmux.type("fix the add function")
        tmux.key("Enter")
        shown = tmux.wait("add returns a + b now")
        assert "▸ editor" in shown  # the tool cards
        assert "✓ done" in shown

        if quit_key == "C-c":  # twice: the first only says how to quit
            tmux.key(quit_key)
            tmux.wait("ctrl+c again to quit")
        tmux.key(quit_key)
        # the change is not in the tree: quitting says so, and how to get it back
        shown = tmux.wait("not in your tree yet: calculator.py", "q quit anyway", deadline_s=60)
        assert "clover-agent tui --resume" in shown
        tmux.key("q")
        shown = tmux.wait("EXIT=0", deadline_s=60)
        said = "(1 changed file(s) not applied). Continue it: clover-agent tui --resume"
        assert "".join(said.split()) in "".join(shown.split())  # as printed, however the terminal wrapped it
        tmux.type("stty -g > ../after.txt; cmp ../before.txt ../after.txt && echo SAME-$((6 * 7))")
        tmux.key("Enter")
        tmux.wait("SAME-42", deadline_s=30)  # the shell reads commands again, terminal settings restored
        assert "return a - b" in (repo / "calculator.py").read_text()  # nothing applied without /apply
    finally:
        tmux.close()


def test_hostile_output_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """Escape sequences and markup written by the model and by a command are shown, not obeyed."""
    repo = calculator_repo(tmp_path)
    evil = "\x1b[2J\x1b[H\x1b[31m"
    replay = write_replay(
        tmp_path / "hostile.jsonl",
        [
            turn(
                f"[bold red]markup[/] {evil}text [/]",
                call("shell", command="printf '\\033[2J\\033[HEVIL [/] [b]x\\n'"),
            ),
            turn("", call("finish", summary=f"[/] done {evil}")),
        ],
    )
    tmux = Tmux(100, 30, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("[/] hostile [b request")
        tmux.key("Enter")
        shown = tmux.wait(r"done \x1b[2J")
        # the screen was not cleared: the request and the cards above the result are all still there
        for text in (
            "[/] hostile [b request",
            "[bold red]markup[/]",
            "▸ shell",
            r"\x1b[2J\x1b[HEVIL [/] [b]x",
            "replay:hostile",
        ):
            assert text in shown, text
        tmux.key("C-q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_ctrl_c_and_the_focus_in_a_real_terminal(tmp_path: Path) -> None:
    """ctrl+c clears a draft (up brings it back), interrupts a running request, and quits only on
    the second press on an idle, empty prompt; after Tab, typing still goes to the prompt."""
    repo = calculator_repo(tmp_path)
    slow = turn("Reading slowly, file after file. " * 20, call("run_tests"))
    replay = tmp_path / "slow.jsonl"
    replay.write_text(
        json.dumps({"content": slow, "seconds": 60}) + "\n"
        + json.dumps({"content": turn("", call("finish", summary="stopped as asked"))}) + "\n"
    )  # fmt: skip
    tmux = Tmux(100, 30, cwd=repo)
    try:
        tmux.start_tui(replay)

        tmux.type("a draft that must not be lost")
        tmux.wait("a draft that must not be lost")
        tmux.key("C-c")
        shown = tmux.wait("Prompt cleared")
        assert "a draft that must not be lost" not in shown and "EXIT=" not in shown
        tmux.key("Up")
        tmux.wait("a draft that must not be lost")
        tmux.key("C-l")
        tmux.key("Tab", "Tab")
        tmux.type("typed after two tabs")
        tmux.wait("typed after two tabs")  # the prompt kept the focus
        tmux.key("C-l")

        tmux.type("read everything")
        tmux.key("Enter")
        tmux.wait("Reading slowly")
        tmux.key("C-c")
        shown = tmux.wait("Interrupted the model's reply")
        assert "EXIT=" not in shown
        tmux.type("stop there and finish")
        tmux.key("Enter")
        tmux.wait("stopped as asked")

        tmux.key("C-c")
        shown = tmux.wait("ctrl+c again to quit")
        assert "EXIT=" not in shown
        tmux.key("C-c")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_the_view_stays_where_the_reader_is_then_follows_again(tmp_path: Path) -> None:
    """While a request runs, PageUp keeps the view where the person reads: output that arrives
    below says so instead of pulling the view down; PageDown back to the bottom follows again."""
    repo = calculator_repo(tmp_path)
    long_text = "\n\n".join(f"Paragraph {i} of reading the code." for i in range(40))
    replay = write_replay(
        tmp_path / "follow.jsonl",
        [
            turn(long_text, call("shell", command="sleep 6 && echo slept")),
            turn("", call("finish", summary="FOLLOW-DONE: the summary")),
        ],
    )
    tmux = Tmux(100, 30, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("read it all")
        tmux.key("Enter")
        tmux.wait("Paragraph 39 of reading", "running `sleep 6")  # following while it comes

        tmux.key("PageUp")
        shown = tmux.wait("new output below")  # the command's result arrived below the view
        end = time.monotonic() + 120
        while any(w in shown for w in ("running `", "going on", "waiting for")) and time.monotonic() < end:
            time.sleep(0.2)  # until the request is over (the activity line is gone)
            shown = tmux.screen()
        assert "FOLLOW-DONE" not in shown and "new output below" in shown, shown

        for _ in range(6):
            tmux.key("PageDown")
        shown = tmux.wait("FOLLOW-DONE: the summary")
        end = time.monotonic() + 30
        while "new output below" in shown and time.monotonic() < end:  # the marker goes at the bottom
            time.sleep(0.2)
            shown = tmux.screen()
        assert "new output below" not in shown, shown
        tmux.key("C-q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_shell_output_streams_into_the_card(tmp_path: Path) -> None:
    """A command's lines show in its card while it still runs: it prints two lines, then waits for
    a file only the test creates once it has seen them on the screen."""
    repo = calculator_repo(tmp_path)
    gate = tmp_path / "let-it-end"
    # the lines printed are computed, so the card's copy of the command line does not hold them
    script = (
        "echo LINE-$((40 + 2)); sleep 0.5; echo LINE-$((50 + 5)); "
        f"while [ ! -e {gate} ]; do sleep 0.1; done; echo LINE-$((90 + 9))"
    )
    replay = write_replay(
        tmp_path / "stream.jsonl",
        [
            turn("Running it.", call("shell", command=script)),
            turn("", call("finish", summary="STREAMED-DONE")),
        ],
    )
    tmux = Tmux(100, 30, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("run the script")
        tmux.key("Enter")
        shown = tmux.wait("LINE-42", "LINE-55")
        assert not gate.exists()  # so the command is still running: its output came as it printed
        assert "LINE-99" not in shown and "✓ done" not in shown and "STREAMED-DONE" not in shown, shown
        gate.touch()
        shown = tmux.wait("LINE-99", "STREAMED-DONE")
        tmux.key("C-q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_what_the_screen_says_agrees_with_what_happens(tmp_path: Path) -> None:
    """Esc during a shell call: the spinner stops with the status's "waiting for you"; a `finish`
    whose summary the last test run contradicts is not drawn as done; the key hints follow the dialog
    on top (help, then the quit question)."""
    repo = calculator_repo(tmp_path)
    sleep = f"sleep 617.{uuid.uuid4().int % 10**6:06d}"
    replay = write_replay(
        tmp_path / "agree.jsonl",
        [
            turn("This takes a while.", call("shell", command=sleep, timeout=900)),
            turn("", call("editor", command="create", path="/workspace/NOTES.md", file_text="notes\n")),
            turn("", call("run_tests", target="tests/test_calculator.py::test_add")),
            turn("", call("finish", summary="All tests pass")),
        ],
    )
    tmux = Tmux(100, 30, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("fix the calculator")
        tmux.key("Enter")
        tmux.wait(f"running `{sleep}")
        tmux.key("Escape")
        tmux.wait("interrupted: waiting for you")
        time.sleep(1.5)  # the spinner would have counted on by now
        shown = tmux.screen()
        assert "waiting for you" in shown and not any(frame in shown for frame in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"), shown
        assert "going on" not in shown and f"running `{sleep}" not in shown

        tmux.type("go on")
        tmux.key("Enter")
        shown = tmux.wait("1 test(s) failed when last run")
        assert "the agent's summary" in shown and "All tests pass" in shown
        assert "✓ done · " not in shown.split("All tests pass")[-1]  # the finish card is not a success

        tmux.key("?")
        shown = tmux.wait("esc close")
        assert "enter send" not in shown  # the idle hints are gone while help is open
        tmux.key("Escape")
        tmux.wait("enter send")
        tmux.key("C-q")
        tmux.wait("q quit anyway  a review and apply  esc stay")
        tmux.key("q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_what_a_session_costs_is_on_screen(tmp_path: Path) -> None:
    """The status bar: the last request's tokens in and out and time, and the session's totals (no
    rate for recorded turns); `/usage` lists each request and the totals."""
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "usage.jsonl",
        [
            turn("Reading it.", call("editor", command="view", path="/workspace/calculator.py")),
            turn("add subtracts: that is the bug."),
            turn("Nothing else looks wrong."),
        ],
    )
    tmux = Tmux(120, 30, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("why does test_add fail?")
        tmux.key("Enter")
        # the bar's "last" appears once the request has ended, a moment after its answer is on screen
        shown = tmux.wait("that is the bug", "last ")
        bar = next(line for line in shown.splitlines() if "total " in line)
        assert "last " in bar and "↑" in bar and "↓" in bar, bar
        assert "tok/s" not in shown  # a replay's rate would mean nothing
        tmux.type("anything else?")
        tmux.key("Enter")
        tmux.wait("Nothing else looks wrong")
        tmux.type("/usage")
        tmux.key("Enter")
        shown = tmux.wait("in all: 2 request(s), 3 model call(s)")
        assert "request 1: 2 model call(s)" in shown and "request 2: 1 model call(s)" in shown
        tmux.key("C-q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_apply_merges_your_edit_and_the_session_resumes_after_it(tmp_path: Path) -> None:
    """/apply with an edit of yours in the same file: merged, and said; then quit and `--resume`: the
    session takes up the tree as it is now, what was applied counted as applied."""
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "merge.jsonl",
        [turn("Fixing add.", FIX_ADD), turn("", call("finish", summary="add adds now"))],
    )
    tmux = Tmux(120, 32, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("fix add")
        tmux.key("Enter")
        tmux.wait("add adds now")
        calculator = repo / "calculator.py"
        calculator.write_text(calculator.read_text() + "\n# my own note\n")  # your edit, meanwhile
        tmux.type("/apply")
        tmux.key("Enter")
        tmux.wait("Apply to your working tree", deadline_s=240)
        tmux.key("Enter")
        shown = tmux.wait("calculator.py: merged with your edits", deadline_s=120)
        text = calculator.read_text()
        assert "return a + b" in text and text.endswith("# my own note\n"), shown
        tmux.key("C-q")
        shown = tmux.wait("EXIT=0", deadline_s=60)
        flat = "".join(shown.split())
        session = flat.split("clover-agenttui--resume")[-1].split("EXIT=0")[0]
        assert len(session) >= 15, shown

        later = write_replay(tmp_path / "later.jsonl", [turn("Nothing more to do.")])
        command = [str(CLI), "tui", "--resume", session, "--backend", "replay", "--replay", str(later),
                   "--sandbox", "local"]  # fmt: skip
        tmux.type("clear; " + shlex.join(command) + "; echo EXIT=$?")
        tmux.key("Enter")
        shown = tmux.wait(f"Resumed session {session}", "local ready")
        assert "could not be restored" not in shown
        tmux.type("/apply")  # what was applied is in the tree: nothing is left to hand back
        tmux.key("Enter")
        tmux.wait("Nothing to apply", deadline_s=120)
        tmux.key("C-q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()


def test_plan_mode_refuses_edits_until_the_plan_is_approved_then_carries_it(tmp_path: Path) -> None:
    """``/plan``: the request is planned read-only (the edit it tries is refused, the tree and the
    sandbox untouched), the plan's dialog approves it, and the plan is carried out: the fix made,
    its steps ticked off above the prompt."""
    repo = calculator_repo(tmp_path)
    steps = ["Make add return a + b", "Run the tests"]

    def progress(*statuses: str) -> str:
        marked = [{"step": s, "status": st} for s, st in zip(steps, statuses, strict=True)]
        return call("update_plan", steps=json.dumps(marked))

    replay = write_replay(
        tmp_path / "plan.jsonl",
        [
            turn("Trying the fix at once.", FIX_ADD),
            turn("", call("propose_plan", summary="Fix add: it subtracts.", steps=json.dumps(steps))),
            turn("", progress("in_progress", "pending")),
            turn("Fixing add.", FIX_ADD),
            turn("", progress("completed", "in_progress")),
            turn("", call("run_tests", target="tests/test_calculator.py")),
            turn("", progress("completed", "completed")),
            turn("", call("finish", summary="add returns a + b now")),
        ],
    )
    tmux = Tmux(100, 32, cwd=repo)
    try:
        tmux.start_tui(replay)
        tmux.type("/plan")
        tmux.key("Enter")
        tmux.wait("Plan mode:", "plan → workspace")
        tmux.type("fix the add function")
        tmux.key("Enter")
        shown = tmux.wait("The agent proposes this plan", "1. [ ] Make add return a + b", "Approve (a)")
        tmux.key("Escape")  # the plan waits: the refused edit is in the transcript behind it
        tmux.wait("was not allowed", "Plan proposed: Fix add")
        tmux.type("/plan show")
        tmux.key("Enter")
        tmux.wait("The agent proposes this plan")
        tmux.key("a")
        shown = tmux.wait("add returns a + b now", "Plan 2/2", "✓ Run the tests")
        assert "✓ Make add return a + b" in shown and "plan →" not in shown
        tmux.type("/diff")
        tmux.key("Enter")
        tmux.wait("return a + b")  # the change, in the sandbox
        tmux.key("Escape")
        assert "return a - b" in (repo / "calculator.py").read_text()  # the tree waits for /apply
        tmux.key("C-q")
        tmux.wait("q quit anyway", deadline_s=60)
        tmux.key("q")
        tmux.wait("EXIT=0", deadline_s=60)
    finally:
        tmux.close()
