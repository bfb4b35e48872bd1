"""``/diff`` (ctrl+d): every change of the session's workspace, scrollable."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from clover_agent.tui.widgets.diff_view import DiffView


class DiffScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    DiffScreen { align: center middle; }
    DiffScreen > VerticalScroll { width: 95%; height: 95%; border: round $accent; background: $surface; }
    DiffScreen .title { text-style: bold; padding: 0 1; }
    """

    def __init__(self, diff: str) -> None:
        super().__init__()
        self.diff = diff

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            files = self.diff.count("\ndiff --git ") + self.diff.startswith("diff --git ")
            yield Static(
                f"The session's changes: {files} file{'' if files == 1 else 's'} (Esc closes)",
                classes="title",
            )
            yield DiffView(self.diff)
