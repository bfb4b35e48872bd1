"""Quitting with changes your tree does not hold yet: say which, and how to get them back later."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from clover_agent.safe_text import shown_names


class QuitScreen(ModalScreen[str | None]):
    """Dismissed with "quit" (``q``: quit, the changes stay in the saved session), "apply" (``a``:
    review them first) or None (``esc``: stay)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,ctrl+q", "dismiss('quit')", "Quit anyway"),
        Binding("a", "dismiss('apply')", "Review and apply"),
        Binding("escape", "dismiss(None)", "Stay"),
    ]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical {
        width: 90%; max-width: 90; height: auto; border: round $warning; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, files: list[str], resume: str) -> None:
        super().__init__()
        self.files = files
        self.resume = resume

    def compose(self) -> ComposeResult:
        count = len(self.files)
        names = shown_names(self.files[:8])
        more = f" and {count - 8} more" if count > 8 else ""
        with Vertical():
            yield Static(
                Text(f"{count} changed file(s) are not in your tree yet: {names}{more}.", style="bold")
            )
            yield Static(Text(f"They stay in the saved session: {self.resume} brings them back."))
            yield Static(
                Text.from_markup(
                    "[b]q[/b] quit anyway   [b]a[/b] review and apply (/apply)   [b]esc[/b] stay"
                )
            )
