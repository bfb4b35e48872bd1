"""What makes the app discoverable, driven with keys: the ``/`` menu of the commands (fuzzy filter,
Up/Down, Tab/Enter, Esc), the commands in the command palette (ctrl+p), the key hints of the
moment (idle, running, an approval waiting, the menu open), the first screen of a new session, and
``?`` on an empty prompt opening the help."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.command import CommandList, CommandPalette
from textual.widgets import TextArea

from clover_agent.events import CallInterrupted, Done, ModelDelta
from clover_agent.tui.app import CloverApp
from clover_agent.tui.keys import COMMANDS
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.help import HelpScreen
from clover_agent.tui.widgets.key_hints import KeyHints
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.path_menu import PathMenu, commands_matching
from clover_agent.tui.widgets.welcome import Welcome, welcome
from tests.tui.helpers import (
    FIX_ADD,
    SlowReplay,
    calculator_repo,
    call,
    make_app,
    send,
    turn,
    wait_for,
    write_replay,
)


def _notices(app: CloverApp) -> str:
    return "\n".join(n.text for n in app.query(NoticeLine))


def _hints(app: CloverApp) -> str:
    return app.query_one(KeyHints).state


def test_commands_match_fuzzily_names_starting_with_the_query_first() -> None:
    assert [c.name for c in commands_matching("ap")] == ["apply"]
    assert [c.name for c in commands_matching("")] == [c.name for c in COMMANDS]
    assert [c.name for c in commands_matching("ts")] == ["tests"]  # letters in order, not adjacent
    found = [c.name for c in commands_matching("e")]
    assert found[0] == "export" and set(found) >= {"help", "tests", "model", "clear"}
    assert commands_matching("zz") == []


async def test_the_slash_menu_opens_filters_and_completes(tmp_path: Path) -> None:
    app = make_app(calculator_repo(tmp_path), write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(100, 30)) as pilot:
        menu = app.query_one(PathMenu)
        await pilot.press("/")
        assert menu.is_open and menu.option_count == len(COMMANDS)
        assert menu.chosen == COMMANDS[0].name
        assert _hints(app) == "menu"
        await pilot.press("down")
        assert menu.chosen == COMMANDS[1].name and app.prompt.text == "/"  # down moves in the menu
        await pilot.press("up", "up")
        assert menu.chosen == COMMANDS[-1].name  # up from the first wraps to the last
        await pilot.press("a", "p")
        assert menu.option_count == 1 and menu.chosen == "apply"
        await pilot.press("tab")
        assert app.prompt.text == "/apply " and not menu.is_open
        assert app.focused is app.prompt and _hints(app) == "idle"

        await pilot.press("ctrl+l", "/", "p", "o")
        assert menu.chosen == "policy"
        await pilot.press("escape")  # closes the menu only
        assert not menu.is_open and app.prompt.text == "/po"
        await pilot.press("ctrl+l", *"tell me /apply")  # not first in the prompt: no menu
        assert not menu.is_open

        await pilot.press("ctrl+l", "/", "h", "e", "enter")  # Enter completes
        assert app.prompt.text == "/help " and not isinstance(app.screen, HelpScreen)
        await pilot.press("enter")  # and then sends
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await pilot.press("escape")
        await pilot.press(*"/policy")
        assert menu.chosen == "policy"
        await pilot.press("enter")  # typed out already: Enter runs it
        await wait_for(pilot, lambda: "Policy: workspace" in _notices(app), "the policy notice")
        assert app.prompt.text == "" and not menu.is_open


async def test_the_palette_lists_the_commands_and_runs_one(tmp_path: Path) -> None:
    app = make_app(calculator_repo(tmp_path), write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")

        def listed() -> str:
            options = app.screen.query_one(CommandList)
            return "\n".join(str(options.get_option_at_index(i).prompt) for i in range(options.option_count))

        await wait_for(pilot, lambda: all(c.usage in listed() for c in COMMANDS), "every command listed")
        assert all(c.description in listed() for c in COMMANDS)
        await pilot.press(*"/polic")
        await wait_for(pilot, lambda: listed().startswith("/policy"), "/policy first")
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Policy: workspace" in _notices(app), "the command to run")

        await pilot.press("ctrl+p", *"/sandbox")  # it needs an argument: put in the prompt
        await wait_for(pilot, lambda: listed().startswith("/sandbox"), "/sandbox first")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.prompt.text == "/sandbox ", "the command in the prompt")
        assert app.focused is app.prompt


async def test_the_first_screen_and_question_mark(tmp_path: Path) -> None:
    app = make_app(calculator_repo(tmp_path), write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.query(Welcome)  # a new session: the transcript is empty but for it
        console = Console(width=78, record=True, file=io.StringIO())
        console.print(welcome())
        shown = console.export_text()
        assert "clover-agent: a coding agent" in shown
        assert "changes stay in the sandbox until you /apply them" in shown
        assert [line.split(". ")[0].split()[-1] for line in shown.splitlines()[-3:]] == ["1", "2", "3"]
        assert "/tests" in shown and "make the failing test pass" in shown

        await pilot.press("?")  # on an empty prompt: the help
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await pilot.press("escape")
        await pilot.press(*"why?")  # in a text: typed
        assert app.prompt.text == "why?" and not isinstance(app.screen, HelpScreen)


@pytest.mark.slow
async def test_the_hints_follow_the_run_an_interrupt_and_an_approval(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    long_answer = turn("I will read every file in the repository, one by one. " * 30, call("run_tests"))
    replay = write_replay(
        tmp_path / "slow.jsonl", [long_answer, turn("", FIX_ADD), turn("", call("finish", summary="fixed"))]
    )
    slow = SlowReplay(replay, pauses=[0.25, 0.0])  # the first answer takes minutes to stream
    try:
        app = make_app(repo, slow.backend, policy="ask")
        async with app.run_test(size=(100, 30)) as pilot:
            assert _hints(app) == "idle"
            assert "esc interrupt" not in str(app.query_one(KeyHints).render())
            await send(pilot, "fix the calculator")
            await wait_for(pilot, lambda: any(isinstance(e, ModelDelta) for e in app.events), "the answer")
            await wait_for(pilot, lambda: _hints(app) == "running", "the running hints")
            assert "esc interrupt" in str(app.query_one(KeyHints).render())
            await pilot.press("escape")
            await wait_for(pilot, lambda: any(isinstance(e, CallInterrupted) for e in app.events), "the stop")
            await wait_for(pilot, lambda: _hints(app) == "idle", "the idle hints")  # the agent waits for you

            await send(pilot, "only change add()")
            await wait_for(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
            await wait_for(pilot, lambda: _hints(app) == "approval", "the approval hints")
            await pilot.press("y")
            await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the end")
            await wait_for(pilot, lambda: _hints(app) == "idle", "the idle hints")
            await pilot.press("ctrl+q")
    finally:
        slow.close()


async def test_a_command_typed_out_runs_as_typed_whatever_the_menu_highlights(tmp_path: Path) -> None:
    """Before: typing `/apply` fast and Enter ran the command the menu still highlighted from the
    `/` (its filter had not caught up): in a real terminal under load, `/undo`."""
    from tests.tui.helpers import calculator_repo, make_app, write_replay

    app = make_app(calculator_repo(tmp_path), write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("/")
        await pilot.pause()
        assert app.menu.is_open and app.menu.chosen != "usage"  # the menu highlights another one
        with app.prompt.prevent(TextArea.Changed):  # typed on, before the menu's filter has followed
            app.prompt.load_text("/usage")
        assert app.menu.is_open and app.menu.chosen != "usage"
        await pilot.press("enter")
        await pilot.pause()
        shown = " ".join(str(n.text) for n in app.query("NoticeLine"))
        assert "No request yet: nothing used." in shown
        assert app.prompt.text == ""
        await pilot.press("ctrl+q")
