"""A request of the person's in the transcript (queued ones and undone ones marked)."""

from __future__ import annotations

from textual.widgets import Static


class UserMessage(Static):
    """The text the person sent. Classes: ``-queued`` (waits for the agent's turn to end),
    ``-undone`` (its changes were undone)."""

    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $accent;
        background: $boost;
    }
    UserMessage.-queued { border-left: thick $warning; color: $text-muted; }
    UserMessage.-undone { border-left: thick $error 50%; color: $text-disabled; text-style: strike; }
    """

    def __init__(self, text: str, turn: int | None = None, *, queued: bool = False) -> None:
        super().__init__(text, markup=False, classes="-queued" if queued else "")
        self.turn = turn
        self.text = text
