"""A running command's card shows its output as it comes (replayed turns, a real local sandbox):
the streamed lines are there before the command ends, escape sequences in them drawn as visible
escapes, and Esc during the command leaves what it printed in the card and in the tool result the
model reads."""

from __future__ import annotations

import uuid
from pathlib import Path

from clover_agent.agent.notes import INTERRUPTED_TOOL
from clover_agent.events import Done, ToolCallFinished
from clover_agent.tui.app import CloverApp
from clover_agent.tui.widgets.tool_card import ToolCard
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay


def _body(card: ToolCard) -> str:
    """What the card's body draws (its output widgets' text)."""
    return "\n".join(str(w.render()) for w in card.query(".card-output"))


def _card(app: CloverApp) -> ToolCard | None:
    cards = app.transcript.cards
    return cards[0] if cards else None


async def test_the_card_shows_the_output_before_the_command_ends(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    gate = tmp_path / f"gate-{uuid.uuid4().hex}"  # the test decides when the command goes on
    command = (
        "echo first-line; printf 'red \\033[31mtext\\033[2J cleared\\n'; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo second-line"
    )
    replay = write_replay(
        tmp_path / "r.jsonl",
        [turn("", call("shell", command=command, timeout=600)), turn("", call("finish", summary="ran"))],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "run it")
        await wait_for(pilot, lambda: _card(app) is not None, "the card")
        card = _card(app)
        assert card is not None
        await wait_for(pilot, lambda: "cleared" in _body(card), "the streamed lines")
        assert card.result is None and card.has_class("-running")  # the command still runs
        live = _body(card)
        assert "first-line" in live and "second-line" not in live
        assert "\x1b" not in live and "\\x1b[31m" in live  # the escape drawn, not obeyed
        gate.touch()
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
        assert card.result is not None and "second-line" in _body(card)
        assert "\x1b" not in _body(card)
        await pilot.press("ctrl+q")


async def test_esc_during_a_command_keeps_its_partial_output(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    command = "echo partial-one; echo partial-two; sleep 600.8; echo never-printed"
    replay = write_replay(
        tmp_path / "r.jsonl",
        [turn("", call("shell", command=command, timeout=900)), turn("", call("finish", summary="stopped"))],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "run it")
        await wait_for(pilot, lambda: _card(app) is not None, "the card")
        card = _card(app)
        assert card is not None
        await wait_for(pilot, lambda: "partial-two" in _body(card), "the streamed lines")
        await pilot.press("escape")
        await wait_for(pilot, lambda: card.result is not None, "the interrupted result")
        assert card.was_interrupted and card.has_class("-error")
        assert "partial-one" in _body(card) and "partial-two" in _body(card)  # kept in the card
        (finished,) = [e for e in app.events if isinstance(e, ToolCallFinished)]
        assert finished.output.startswith(INTERRUPTED_TOOL) and "partial-two" in finished.output
        await send(pilot, "fine, stop there")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "the request")
        assert app.session is not None and app.session.agent is not None
        told = [m.get("content") for m in app.session.agent.messages if m.get("role") == "tool"]
        assert told[0] == finished.output  # the model read it too
        assert "never-printed" not in _body(card)
        await pilot.press("ctrl+q")
