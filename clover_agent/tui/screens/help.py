"""``/help`` (F1): the key bindings and the slash commands."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from clover_agent.tui.keys import COMMANDS, KEYS


def help_table() -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row("[u]Commands[/u]", "")
    for command in COMMANDS:
        table.add_row(Text(command.usage, style="bold"), command.description)  # "[markers]": not markup
    table.add_row("", "")
    table.add_row("[u]Keys[/u]", "")
    for key in KEYS:
        where = f" ({key.where})" if key.where != "anywhere" else ""
        table.add_row(key.keys.replace(",", " / "), key.description + where)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,f1", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 100; height: 90%; border: round $accent; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_table())
            yield Static("[dim]Esc closes[/dim]")
