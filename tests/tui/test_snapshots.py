"""SVG snapshots of the main screens (pytest-textual-snapshot): a session redrawn from fixed events
(so every figure on screen is fixed), at 100x30 and 80x24, dark and light, the dialogs, and a new
session: its first screen and the command menu.
Update them with ``pytest tests/tui/test_snapshots.py --snapshot-update`` and review the SVGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from clover_agent.events import (
    ApprovalDecided,
    Done,
    Event,
    ModelDelta,
    ModelResponded,
    ProvisionalBlock,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.session.events import ApprovalNeeded, SessionStarted, TurnStarted
from clover_agent.session.store import SavedSession, SessionInfo
from clover_agent.tui.app import CloverApp
from clover_agent.tui.handback import FileChange
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.help import HelpScreen
from tests.tui.helpers import calculator_repo, make_app, write_replay

T0 = 1_767_225_600.0  # fixed timestamps: the status line's figures come from them
DIFF = (
    "--- a/calculator.py\n+++ b/calculator.py\n@@ -3,7 +3,7 @@\n \n def add(a: float, b: float) -> float:\n"
    '     """Return the sum of a and b."""\n-    return a - b\n+    return a + b\n \n \n def subtract(a: float, b: float) -> float:\n'
)
REPORT = {
    "framework": "pytest",
    "passed": 4,
    "failed": 1,
    "errors": 0,
    "skipped": 0,
    "outcomes": {
        "tests/test_calculator.py::test_add": "failed",
        "tests/test_calculator.py::test_subtract": "passed",
    },
}


def _events() -> list[Event]:
    def at(i: float) -> dict[str, Any]:
        return {"time": T0 + i}

    edit = {
        "command": "str_replace",
        "path": "/workspace/calculator.py",
        "old_str": "return a - b",
        "new_str": "return a + b",
    }
    return [
        SessionStarted(
            session_id="demo",
            repo="/r",
            backend="replay:demo.jsonl",
            sandbox="local",
            policy="workspace",
            **at(0),
        ),
        TurnStarted(turn=1, text="make test_add pass", first_step=1, **at(1)),
        RunStarted(
            run_id="demo",
            task="make test_add pass",
            backend="replay",
            limits={"max_steps": 50, "max_time_s": 1800},
            **at(1),
        ),
        ModelDelta(step=1, kind="reasoning", text="The request names add; reproduce it first.", **at(1.5)),
        ModelDelta(step=1, kind="text", text="I will run the failing test first.", **at(2)),
        ModelResponded(
            step=1,
            raw="",
            content="I will run the failing test first.",
            reasoning="The request names add; reproduce it first.",
            tool_calls=[],
            format_error=None,
            prompt_tokens=1900,
            completion_tokens=60,
            finish_reason="tool_calls",
            **at(3),
        ),
        ToolCallStarted(
            step=1,
            call_id="c1",
            name="run_tests",
            arguments={"target": "tests/test_calculator.py::test_add"},
            **at(3),
        ),
        ToolCallFinished(
            step=1,
            call_id="c1",
            name="run_tests",
            output="1 failed",
            is_error=True,
            data={"report": REPORT},
            duration_s=1.2,
            **at(4),
        ),
        ModelDelta(step=2, kind="text", text="`add` subtracts; I will fix it.", **at(5)),
        ModelResponded(
            step=2,
            raw="",
            content="`add` subtracts; I will fix it.",
            reasoning=None,
            tool_calls=[],
            format_error=None,
            prompt_tokens=2300,
            completion_tokens=80,
            finish_reason="tool_calls",
            **at(6),
        ),
        ToolCallStarted(step=2, call_id="c2", name="editor", arguments=edit, **at(6)),
        ApprovalDecided(
            step=2,
            call_id="c2",
            name="editor",
            approved=True,
            decided_by="user",
            reason="policy 'ask'",
            **at(7),
        ),
        ToolCallFinished(
            step=2,
            call_id="c2",
            name="editor",
            output="edited",
            is_error=False,
            data={"diff": DIFF},
            duration_s=0.1,
            **at(7),
        ),
        ToolCallStarted(step=3, call_id="c3", name="shell", arguments={"command": "seq 1 20"}, **at(8)),
        ToolCallFinished(
            step=3,
            call_id="c3",
            name="shell",
            output="",
            full_output="\n".join(map(str, range(1, 21))),
            is_error=False,
            data={"exit_code": 0},
            duration_s=0.3,
            **at(9),
        ),
        Done(
            outcome="submitted",
            exit_code=0,
            message="the agent finished the task",
            summary="`add` now adds; the test passes.",
            **at(10),
        ),
    ]


def _app(tmp_path: Path, theme: str = "dark") -> CloverApp:
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "demo.jsonl", [])
    saved = SavedSession(
        SessionInfo("demo", str(repo), title="make test_add pass", requests=1), _events(), None
    )
    return make_app(repo, replay, resume=saved, theme=theme)


async def _settled(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, CloverApp)
    while app.status_bar.sandbox != "ready":
        await pilot.pause(0.05)
    app.prompt.cursor_blink = False
    await pilot.pause()


@pytest.mark.parametrize(("size", "theme"), [((100, 30), "dark"), ((80, 24), "dark"), ((80, 24), "light")])
def test_main_screen(snap_compare, tmp_path: Path, size: tuple[int, int], theme: str) -> None:
    assert snap_compare(_app(tmp_path, theme), terminal_size=size, run_before=_settled)


def test_approval_with_the_diff(snap_compare, tmp_path: Path) -> None:
    async def ask(pilot: Pilot) -> None:
        await _settled(pilot)
        request = ApprovalNeeded(
            call_id="c9",
            name="editor",
            arguments={"command": "str_replace", "path": "/workspace/calculator.py"},
            reason="policy 'ask': ask tool=editor:str_replace",
            preview=DIFF,
            always="every `editor:str_replace` call (any file, not only this one), without asking, "
            "for the rest of this session under the 'ask' policy",
        )
        await pilot.app.push_screen(ApprovalScreen(request))

    assert snap_compare(_app(tmp_path), terminal_size=(80, 24), run_before=ask)


def test_apply_file_by_file(snap_compare, tmp_path: Path) -> None:
    async def review(pilot: Pilot) -> None:
        await _settled(pilot)
        changes = [
            FileChange(
                "calculator.py", "diff --git a/calculator.py b/calculator.py\n" + DIFF, "modified", 1, 1
            ),
            FileChange(
                "notes.md",
                "diff --git a/notes.md b/notes.md\nnew file mode 100644\n--- /dev/null\n+++ b/notes.md\n@@ -0,0 +1 @@\n+notes\n",
                "added",
                1,
                0,
            ),
        ]
        verdict = "needs review: the target passes, but checks of how it passes found something to look at"
        review = ["calculator.py:3: reads the test runner's environment variable PYTEST_CURRENT_TEST (scan)"]
        await pilot.app.push_screen(ApplyScreen(changes, verdict, review))
        await pilot.press("down", "space")  # reject the second file

    assert snap_compare(_app(tmp_path), terminal_size=(100, 30), run_before=review)


def test_help(snap_compare, tmp_path: Path) -> None:
    async def help_(pilot: Pilot) -> None:
        await _settled(pilot)
        await pilot.app.push_screen(HelpScreen())

    assert snap_compare(_app(tmp_path), terminal_size=(100, 30), run_before=help_)


def test_live_diffusion_block(snap_compare, tmp_path: Path) -> None:
    async def decoding(pilot: Pilot) -> None:
        await _settled(pilot)
        app = pilot.app
        assert isinstance(app, CloverApp)
        words = ["def", " add", "(a", ",", " b", "):", "\n", "   ", " return", " a", " +", " b"] + [""] * 20
        app.transcript.token_text = lambda token: words[token]
        filled = [i in (0, 1, 2, 3, 8, 9, 10, 11) for i in range(32)]
        block = ProvisionalBlock(
            step=4,
            block=0,
            position=2048,
            denoise_step=3,
            token_ids=list(range(32)),
            filled=filled,
            newly_filled=[8, 9, 10, 11],
            text="def add(a, return a + b",
            time=T0 + 11,
        )
        await app.transcript.show(block)
        await pilot.pause()

    assert snap_compare(_app(tmp_path), terminal_size=(80, 24), run_before=decoding)


def _new_session(tmp_path: Path) -> CloverApp:
    return make_app(calculator_repo(tmp_path), write_replay(tmp_path / "demo.jsonl", []))


def test_first_screen(snap_compare, tmp_path: Path) -> None:
    assert snap_compare(_new_session(tmp_path), terminal_size=(80, 24), run_before=_settled)


def test_command_menu(snap_compare, tmp_path: Path) -> None:
    async def type_slash(pilot: Pilot) -> None:
        await _settled(pilot)
        await pilot.press("/", "e")

    assert snap_compare(_new_session(tmp_path), terminal_size=(80, 24), run_before=type_slash)
