"""A request of the person's in the transcript (queued, blocked and undone ones marked)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class UserMessage(Static):
    """The text the person sent. Classes: ``-queued`` (sent while the agent works, not read by it yet),
    ``-blocked`` (never sent to the model: a UserPromptSubmit hook blocked it), ``-undone`` (its
    changes were undone)."""

    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $accent;
        background: $boost;
    }
    UserMessage.-queued { border-left: thick $warning; color: $text-muted; }
    UserMessage.-blocked { border-left: thick $error; color: $text-muted; }
    UserMessage.-undone { border-left: thick $error 50%; color: $text-disabled; text-style: strike; }
    """

    def __init__(
        self, text: str, turn: int | None = None, *, queued: bool = False, blocked: bool = False
    ) -> None:
        super().__init__(classes="-queued" if queued else "-blocked" if blocked else "")
        self.turn = turn
        self.text = text
        self.sent = text  # as the agent gets it (@paths resolved): how a queued one is recognised
        self.show(text, turn)

    def show(self, text: str, turn: int | None) -> None:
        """Draw ``text`` with its request number (what ``/undo N`` names)."""
        self.turn = turn
        self.update(Text.assemble((f"#{turn} " if turn is not None else "", "dim"), text))
