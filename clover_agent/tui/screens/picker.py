"""A list to pick one entry from: which request ``/undo`` goes back before, which saved session
``--resume`` continues."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from clover_agent.session.store import SessionInfo
from clover_agent.tui.session import Turn
from clover_agent.tui.text import printable


class PickerScreen(ModalScreen[str | None]):
    """Dismissed with the chosen entry's id (Enter), or None (Esc)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    PickerScreen { align: center middle; }
    PickerScreen > Vertical {
        width: 95%; max-width: 110; height: auto; max-height: 90%; border: round $accent; background: $surface;
    }
    PickerScreen OptionList { height: auto; max-height: 18; }
    """

    def __init__(self, title: str, entries: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text = title
        self.entries = entries  # (id, label)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text)
            yield OptionList(
                *(Option(Text(printable(label, single_line=True)), id=key) for key, label in self.entries)
            )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


def undo_picker(turns: list[Turn]) -> PickerScreen:
    entries = [(str(t.turn), f"{t.turn}. {' '.join(t.text.split())[:80]}") for t in turns]
    return PickerScreen("Undo back to before which request? (Enter picks, Esc cancels)", entries)


def session_picker(sessions: list[SessionInfo]) -> PickerScreen:
    def label(info: SessionInfo) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated))
        requests = f"{info.requests} request{'' if info.requests == 1 else 's'}"
        return f"{when}  {info.shown_title[:60]}  ({requests}, {info.session_id})"

    entries = [(s.session_id, label(s)) for s in sessions]
    return PickerScreen("Resume which session? (Enter resumes, Esc starts a new one)", entries)
