"""The ``@path`` completion menu shown above the prompt while a file name is typed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from clover_agent.tui.text import printable

MAX_SHOWN = 6


def matching(files: list[str], query: str, limit: int = MAX_SHOWN) -> list[str]:
    """Repository files for ``query``: names starting with it first, then paths containing it."""
    query = query.lower()
    starts = [
        f for f in files if f.lower().rsplit("/", 1)[-1].startswith(query) or f.lower().startswith(query)
    ]
    contains = [f for f in files if query in f.lower() and f not in starts]
    return (starts + contains)[:limit]


class PathMenu(OptionList, can_focus=False):
    """Options for the ``@`` word at the prompt's cursor; hidden when there is none."""

    DEFAULT_CSS = """
    PathMenu { height: auto; max-height: 7; border: none; padding: 0 1; background: $panel; display: none; }
    PathMenu.-open { display: block; }
    """

    def show_matches(self, paths: list[str]) -> None:
        self.clear_options()
        self.add_options([Option(Text(printable(p, single_line=True)), id=p) for p in paths])
        self.set_class(bool(paths), "-open")
        if paths:
            self.highlighted = 0

    def close(self) -> None:
        self.clear_options()
        self.remove_class("-open")

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    @property
    def chosen(self) -> str | None:
        if not self.is_open or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id

    def move(self, delta: int) -> None:
        if self.option_count:
            self.highlighted = ((self.highlighted or 0) + delta) % self.option_count
