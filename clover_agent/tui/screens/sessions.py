"""``clover-agent tui --resume`` without an id: pick a saved session of this repository."""

from __future__ import annotations

import time
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from clover_agent.tui.store import SessionInfo


class SessionPicker(ModalScreen[str | None]):
    """Dismissed with the chosen session's id, or None (Esc: start a new session)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "New session")]
    DEFAULT_CSS = """
    SessionPicker { align: center middle; }
    SessionPicker > Vertical { width: 95%; max-width: 110; height: auto; max-height: 90%; border: round $accent; background: $surface; }
    SessionPicker OptionList { height: auto; max-height: 18; }
    """

    def __init__(self, sessions: list[SessionInfo]) -> None:
        super().__init__()
        self.sessions = sessions

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Resume which session? (Enter resumes, Esc starts a new one)")
            yield OptionList(*(Option(self._label(s), id=s.session_id) for s in self.sessions))

    @staticmethod
    def _label(info: SessionInfo) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated))
        requests = f"{info.requests} request{'' if info.requests == 1 else 's'}"
        return f"{when}  {info.shown_title[:60]}  ({requests}, {info.session_id})"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
