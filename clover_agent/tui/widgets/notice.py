"""One line (or a few) of news in the transcript: a command's result, a warning, an error."""

from __future__ import annotations

from textual.widgets import Static

ICONS = {"info": "•", "warning": "!", "error": "✗", "done": "✓"}


class NoticeLine(Static):
    """A notice; ``level`` is info, warning, error or done (its CSS class is ``-<level>``)."""

    DEFAULT_CSS = """
    NoticeLine { padding: 0 1; color: $text-muted; }
    NoticeLine.-warning { color: $warning; }
    NoticeLine.-error { color: $error; text-style: bold; }
    NoticeLine.-done { color: $success; margin: 0 0 1 0; }
    """

    def __init__(self, text: str, level: str = "info") -> None:
        super().__init__(f"{ICONS.get(level, '•')} {text}", markup=False, classes=f"-{level}")
        self.level = level
        self.text = text
