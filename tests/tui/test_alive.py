"""The app shows it is alive: the activity line (a spinner, what the agent does, for how long) while a
request runs, gone once it ends; the transcript follows new output again once the person scrolls
back to the bottom (PageDown or the wheel at the bottom included), and not while they read above
it, when a marker says new output is below."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events

from clover_agent.backends.openai import OpenAIBackend
from clover_agent.events import Done
from clover_agent.session.events import Notice
from clover_agent.tui.app import CloverApp
from clover_agent.tui.widgets.activity import ActivityLine, elapsed
from tests.clover_agent.test_backend_openai import ChatServer
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay
from tests.tui.test_never_lose_work import answer, finish


def test_elapsed_reads_as_seconds_then_minutes() -> None:
    assert [elapsed(s) for s in (0, 9.9, 59, 60, 754)] == ["0s", "9s", "59s", "1m00s", "12m34s"]


@pytest.mark.slow
async def test_the_activity_line_while_a_request_runs(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    server.replies.extend(
        [answer(turn("Checking.", call("shell", command="sleep 3 && echo hi"))), finish("ok")]
    )
    try:
        app = make_app(repo, lambda: OpenAIBackend(server.base_url, api_key="", retries=0))
        async with app.run_test(size=(100, 30)) as pilot:
            activity = app.query_one(ActivityLine)
            await wait_for(pilot, lambda: app.status_bar.sandbox == "ready", "the sandbox")
            assert not activity.display  # idle: not shown
            await send(pilot, "say hi slowly")
            await wait_for(pilot, lambda: activity.what == "running `sleep 3 && echo hi`", "the command")
            assert activity.display
            # the clock goes on while the command runs, with no event coming
            await wait_for(pilot, lambda: "· 1s" in str(activity.render()), "a second to pass")
            await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the end")
            await wait_for(pilot, lambda: not activity.display, "the line to go")
            assert activity.history[:3] == [
                "starting",
                activity.history[1],
                "writing",
            ] and activity.history[1].startswith("waiting for the first token (a prompt of ")
            assert "running `sleep 3 && echo hi`" in activity.history
            await pilot.press("ctrl+q")
    finally:
        server.close()


def _at_bottom(app: CloverApp) -> bool:
    transcript = app.transcript
    return transcript.max_scroll_y > 0 and transcript.scroll_y >= transcript.max_scroll_y


@pytest.mark.slow
async def test_following_resumes_at_the_bottom(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    app = make_app(repo, write_replay(tmp_path / "r.jsonl", []))
    async with app.run_test(size=(80, 24)) as pilot:
        transcript = app.transcript

        async def more(label: str) -> None:
            for i in range(12):
                await transcript.show(Notice(text=f"{label} line {i}"))
            await pilot.pause()

        await more("first")
        await more("second")
        await more("third")
        await wait_for(pilot, lambda: _at_bottom(app), "the view to follow")

        await pilot.press("pagedown")  # at the bottom already: still following
        await more("after pagedown")
        await wait_for(pilot, lambda: _at_bottom(app), "the view to follow after PageDown")

        wheel = events.MouseScrollDown(transcript, 2, 2, 0, 1, 0, False, False, False, screen_x=2, screen_y=2)
        transcript.post_message(wheel)  # the wheel at the bottom, likewise
        await pilot.pause()
        await more("after the wheel")
        await wait_for(pilot, lambda: _at_bottom(app), "the view to follow after the wheel")

        await pilot.press("pageup")  # reading above: new output does not pull the view down
        await wait_for(pilot, lambda: not _at_bottom(app), "the view to move up")
        marker = app.query_one("#new-below")
        assert not marker.display
        await more("while reading")
        await wait_for(pilot, lambda: marker.display, "the new-output marker")
        assert not _at_bottom(app)

        for _ in range(5):  # back to the bottom: following again
            await pilot.press("pagedown")
        await wait_for(pilot, lambda: _at_bottom(app), "the bottom")
        await wait_for(pilot, lambda: not marker.display, "the marker to go")
        await more("after coming back")
        await wait_for(pilot, lambda: _at_bottom(app), "the view to follow again")
        await pilot.press("ctrl+q")
