"""The app never wedges and never loses work: an error no layer expected ends its request (said in
place, after the request) and the next request, Esc and ``/clear`` work; ctrl+c clears a non-empty
prompt (Up brings the text back), interrupts a running request, and quits only when pressed twice
on an idle, empty prompt; the prompt keeps the focus; a draft survives a quit. The model is a real
local chat-completions server and the real openai backend; a tool-call argument nested too deep
for Python's JSON reader is the unexpected error (a ``RecursionError`` in that backend)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clover_agent.backends.openai import OpenAIBackend
from clover_agent.events import CallInterrupted, Done, ModelDelta
from clover_agent.session.store import list_sessions, load_session
from clover_agent.tui.app import QUIT_HINT, CloverApp
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.session import ERRORS_FILE
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.prompt import PromptBox
from clover_agent.tui.widgets.tool_card import ToolCard
from clover_agent.tui.widgets.user_message import UserMessage
from tests.clover_agent.test_backend_openai import ChatServer
from tests.tui.helpers import calculator_repo, call, make_app, send, session_key, turn, wait_for

#: Nested deeper than Python's JSON reader can go: its ``json.loads`` raises ``RecursionError``.
TOO_DEEP = "[" * 100_000 + "]" * 100_000
UNEXPECTED = "The request ended on an unexpected error"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def answer(text: str, *, pause: float = 0.0, piece: int = 16) -> dict[str, Any]:
    """A streamed assistant turn, ``piece`` characters a chunk, ``pause`` seconds between chunks."""
    chunks: list[Any] = [_chunk({"content": text[i : i + piece]}) for i in range(0, len(text), piece)]
    return {"sse": [*chunks, _chunk({}, "stop"), "[DONE]"], "pause": pause}


def too_deep() -> dict[str, Any]:
    """A structured tool call whose arguments the backend cannot read (an unexpected error)."""
    delta = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "shell", "arguments": TOO_DEEP}}]}
    return {"sse": [_chunk(delta), _chunk({}, "tool_calls"), "[DONE]"]}


def refused() -> dict[str, Any]:
    """The server refuses the call (an error the backend expects: the run ends as an error)."""
    return {"status": 400, "json": {"error": {"message": "bad request: the prompt is malformed"}}}


def finish(summary: str) -> dict[str, Any]:
    return answer(turn("", call("finish", summary=summary)))


def _done(app: CloverApp) -> list[Done]:
    return [e for e in app.events if isinstance(e, Done)]


def _notices(app: CloverApp) -> list[NoticeLine]:
    return list(app.query(NoticeLine))


def _backend(server: ChatServer) -> Callable[[], OpenAIBackend]:
    return lambda: OpenAIBackend(server.base_url, api_key="", retries=0)


@pytest.mark.slow
async def test_an_unexpected_error_ends_the_request_and_the_session_goes_on(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    server.replies.extend([too_deep(), finish("the second request ran")])
    try:
        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "first request")
            await wait_for(
                pilot, lambda: any(UNEXPECTED in n.text for n in _notices(app)), "the error notice"
            )
            agent = app.session.agent
            assert not agent.running and not app.session.busy  # nothing left "already running"
            (done,) = _done(app)
            assert done.outcome == "error" and "RecursionError" in done.message
            # in place: the notice comes after the request it belongs to, as the last thing drawn
            children = list(app.transcript.children)
            request = next(i for i, w in enumerate(children) if isinstance(w, UserMessage))
            notice = next(
                i for i, w in enumerate(children) if isinstance(w, NoticeLine) and UNEXPECTED in w.text
            )
            assert request < notice == len(children) - 1
            log = app.session.folder / ERRORS_FILE
            assert "RecursionError" in log.read_text()  # the traceback is kept

            await pilot.press("escape")  # Esc on the idle agent: no harm, nothing wedged
            await send(pilot, "/clear")
            await wait_for(pilot, lambda: any("New conversation" in n.text for n in _notices(app)), "/clear")
            await send(pilot, "second request")
            await wait_for(pilot, lambda: len(_done(app)) == 2, "the second request")
            assert _done(app)[1].outcome == "submitted", _done(app)[1].message
            assert "the second request ran" in _notices(app)[-1].text
            await pilot.press("ctrl+q")
    finally:
        server.close()


@pytest.mark.slow
async def test_ctrl_c_clears_then_interrupts_then_quits_on_the_second_press(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    slow = answer(turn("Reading every file, one by one. " * 40, call("run_tests")), pause=0.25)
    server.replies.extend([slow, finish("stopped as asked")])
    try:
        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            draft = "a long draft\n" * 50
            app.prompt.load_text(draft)
            await pilot.press("ctrl+c")  # a non-empty prompt: cleared, not quit
            assert app.is_running and app.prompt.text == ""
            await pilot.press("up")
            assert app.prompt.text == draft.strip()  # the cleared text is in the history
            await pilot.press("ctrl+l")  # the key that only clears
            assert app.prompt.text == ""

            await send(pilot, "read everything")
            await wait_for(
                pilot, lambda: sum(isinstance(e, ModelDelta) for e in app.events) >= 3, "streaming"
            )
            await pilot.press("ctrl+c")  # a running request: interrupted, not quit
            await wait_for(
                pilot, lambda: any(isinstance(e, CallInterrupted) for e in app.events), "the interrupt"
            )
            assert app.is_running and not _done(app)
            await send(pilot, "stop there")
            await wait_for(pilot, lambda: _done(app), "the end")
            assert _done(app)[0].outcome == "submitted"

            await pilot.press("ctrl+c")  # idle, empty prompt: only the hint
            await pilot.pause()
            assert app.is_running
            assert any(QUIT_HINT in str(n.message) for n in app._notifications)
            await pilot.press("f2", "f2")  # another key in between: it starts over
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert app.is_running
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: not app.is_running, "the quit")
    finally:
        server.close()


@pytest.mark.slow
async def test_the_prompt_keeps_the_focus(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    server.replies.extend([answer(turn("", call("shell", command="echo hi"))), finish("ran it")])
    try:
        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "say hi")
            await wait_for(pilot, lambda: _done(app), "the end")
            await pilot.press("tab", "tab", "shift+tab")
            assert isinstance(app.focused, PromptBox)  # Tab with no @path being typed: nothing moves
            card = app.query_one(ToolCard)
            await pilot.click(ToolCard)  # a click in the transcript takes the focus...
            assert app.focused is not app.prompt
            await pilot.press("o", "k", "space", "x", "backspace")
            assert app.prompt.text == "ok " and isinstance(app.focused, PromptBox)  # ...not the typing
            assert card.is_mounted
            await pilot.press("ctrl+q")
    finally:
        server.close()


@pytest.mark.slow
async def test_a_draft_survives_a_quit(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    server.replies.append(finish("first done"))
    draft = "next: make subtract\nhandle floats too"
    try:
        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            await send(pilot, "first request")
            await wait_for(pilot, lambda: _done(app), "the end")
            app.prompt.load_text(draft)
            await pilot.press("ctrl+q")
        session_id = app.session.session_id
        saved = load_session(repo, session_id, session_key(repo))
        assert saved.info.draft == draft
        info = json.loads((app.session.folder / "session.json").read_text())
        assert info["draft"] == draft  # in the signed index of the session folder

        again = make_app(repo, _backend(server), resume=saved)
        async with again.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: again.prompt.text == draft, "the draft in the prompt")
            assert any("draft is back" in n.text for n in _notices(again))
            await pilot.press("ctrl+q")
    finally:
        server.close()


@pytest.mark.slow
async def test_fifty_requests_with_interrupts_failures_and_approvals(tmp_path: Path) -> None:
    """One session, no restart: every fifth request is each of a shell call approved, an unexpected
    error, a refused model call, an interrupt then a correction, and a denied call."""
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    slow = answer(turn("Looking around first. " * 60, call("run_tests")), pause=0.1)
    for i in range(10):
        server.replies.extend(
            [
                answer(turn("", call("shell", command=f"echo round-{i}"))),
                finish(f"approved {i}"),
                too_deep(),
                refused(),
                slow,
                finish(f"corrected {i}"),
                answer(turn("", call("shell", command="rm -rf /workspace/tests"))),
                finish(f"denied {i}"),
            ]
        )
    try:
        app = make_app(repo, _backend(server), policy="ask")
        async with app.run_test(size=(100, 30)) as pilot:

            async def approve(key: str) -> None:
                await wait_for(pilot, lambda: isinstance(app.screen, ApprovalScreen), "the approval")
                await pilot.press(key)

            async def ended(count: int) -> Done:
                await wait_for(pilot, lambda: len(_done(app)) == count, f"request {count} to end")
                return _done(app)[-1]

            def streamed(count: int) -> Callable[[], bool]:
                return lambda: sum(isinstance(e, ModelDelta) for e in app.events) >= count

            for i in range(10):
                n = 5 * i
                await send(pilot, f"request {n + 1}: run a command")
                await approve("y")
                done = await ended(n + 1)
                assert done.summary == f"approved {i}"

                await send(pilot, f"request {n + 2}: this one crashes")
                done = await ended(n + 2)
                assert "RecursionError" in done.message

                await send(pilot, f"request {n + 3}: the server refuses")
                done = await ended(n + 3)
                assert done.outcome == "error" and "malformed" in done.message

                deltas = sum(isinstance(e, ModelDelta) for e in app.events)
                await send(pilot, f"request {n + 4}: slow")
                await wait_for(pilot, streamed(deltas + 2), "the slow answer to stream")
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.session.agent.steering.paused, "the interrupt")
                await send(pilot, "enough, finish")
                done = await ended(n + 4)
                assert done.summary == f"corrected {i}"

                await send(pilot, f"request {n + 5}: remove the tests")
                await approve("n")
                done = await ended(n + 5)
                assert done.summary == f"denied {i}"
                assert not app.session.busy and not app.session.agent.running
            assert len(app.session.turns) == 50 and len(_done(app)) == 50
            assert (repo / "tests").is_dir()
            await pilot.press("ctrl+q")
    finally:
        server.close()


@pytest.mark.slow
async def test_a_draft_alone_keeps_a_session_and_nothing_keeps_none(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    try:
        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.status_bar.sandbox == "ready", "the sandbox")
            await pilot.press("ctrl+q")
        assert list_sessions(repo, session_key(repo)) == []  # no request, no draft: not listed

        app = make_app(repo, _backend(server))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.status_bar.sandbox == "ready", "the sandbox")
            await pilot.press(*"half a thought")
            await pilot.press("ctrl+q")
        (listed,) = list_sessions(repo, session_key(repo))
        assert listed.draft == "half a thought" and listed.requests == 0
        again = make_app(
            repo, _backend(server), resume=load_session(repo, listed.session_id, session_key(repo))
        )
        async with again.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: again.prompt.text == "half a thought", "the draft in the prompt")
            await pilot.press("ctrl+q")
    finally:
        server.close()
