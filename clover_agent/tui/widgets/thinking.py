"""The model's reasoning: dimmed, open while it streams, folded once the turn is complete."""

from __future__ import annotations

from textual.widgets import Collapsible, Static


class Thinking(Collapsible):
    """Reasoning text of one model turn; ``ctrl+t`` (the app) opens or folds them all."""

    DEFAULT_CSS = """
    Thinking { border: none; padding: 0; margin: 0; background: transparent; }
    Thinking > Contents { padding: 0 0 0 2; }
    Thinking CollapsibleTitle { color: $text-muted; padding: 0 1; }
    Thinking #thinking-text { color: $text-muted; text-style: italic; }
    """

    def __init__(self, *, keep_open: bool = False) -> None:
        self._body = Static("", id="thinking-text", markup=False)
        super().__init__(self._body, title="Thinking…", collapsed=False)
        self.text = ""
        self.keep_open = keep_open

    def feed(self, text: str) -> None:
        self.text += text
        self._body.update(self.text.strip("\n"))

    def finish(self, reasoning: str | None) -> None:
        if reasoning is not None and reasoning.strip() != self.text.strip():
            self.text = reasoning
            self._body.update(self.text.strip("\n"))
        lines = len(self.text.strip().splitlines())
        self.title = f"Thought ({lines} line{'' if lines == 1 else 's'})"
        self.collapsed = not self.keep_open
        self.display = bool(self.text.strip())
