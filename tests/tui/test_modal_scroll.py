"""Dialogs own their scroll keys: PageDown, End and Down in the help screen and in ``/diff`` scroll
the dialog, never the transcript behind it."""

from __future__ import annotations

from pathlib import Path

from textual.containers import VerticalScroll

from clover_agent.events import Done
from clover_agent.tui.screens.diff import DiffScreen
from clover_agent.tui.screens.help import HelpScreen
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay


async def test_page_keys_scroll_the_dialog_not_the_transcript(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    long_file = "".join(f"line {i}\n" for i in range(120))
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("", call("editor", command="create", path="/workspace/LONG.md", file_text=long_file)),
            turn("", call("finish", summary="\n".join(f"point {i}" for i in range(60)))),
        ],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(90, 16)) as pilot:
        await send(pilot, "go")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
        transcript = app.transcript
        transcript.scroll_home(animate=False)
        await pilot.pause()
        assert transcript.max_scroll_y > 0 and transcript.scroll_y == 0

        for key, screen_type in (("f1", HelpScreen), ("ctrl+d", DiffScreen)):
            await pilot.press(key)
            await wait_for(pilot, lambda t=screen_type: isinstance(app.screen, t), f"{key}'s dialog")
            view = app.screen.query_one(VerticalScroll)
            await pilot.pause()
            assert view.max_scroll_y > 0, "the dialog's content is longer than the dialog"
            await pilot.press("pagedown")
            await wait_for(pilot, lambda v=view: v.scroll_y > 0, "PageDown scrolling the dialog")
            paged = view.scroll_y
            await pilot.press("down")
            await wait_for(pilot, lambda v=view, p=paged: v.scroll_y > p, "Down scrolling the dialog")
            await pilot.press("end")
            await wait_for(pilot, lambda v=view: v.scroll_y == v.max_scroll_y, "End in the dialog")
            await pilot.press("home")
            await wait_for(pilot, lambda v=view: v.scroll_y == 0, "Home in the dialog")
            assert transcript.scroll_y == 0, "the transcript behind the dialog did not move"
            await pilot.press("escape")
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, "the dialog closing")
