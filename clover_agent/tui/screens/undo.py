"""``/undo`` without a number: pick the request to go back before."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from clover_agent.tui.session import Turn


class UndoScreen(ModalScreen[int | None]):
    """Dismissed with the chosen request's number, or None (Esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    UndoScreen { align: center middle; }
    UndoScreen > Vertical { width: 90%; max-width: 100; height: auto; max-height: 80%; border: round $accent; background: $surface; }
    UndoScreen OptionList { height: auto; max-height: 16; }
    """

    def __init__(self, turns: list[Turn]) -> None:
        super().__init__()
        self.turns = turns

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Undo back to before which request? (Enter picks, Esc cancels)")
            yield OptionList(
                *(Option(f"{t.turn}. {' '.join(t.text.split())[:80]}", id=str(t.turn)) for t in self.turns)
            )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))
