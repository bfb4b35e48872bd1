"""The completion menu shown above the prompt: ``@path`` files while a file name is typed, the
slash commands (with what each does) while a ``/command`` is typed at the start of the prompt."""

from __future__ import annotations

from rich.text import Text
from textual.fuzzy import Matcher
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from clover_agent.tui.keys import COMMANDS, Command
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


def commands_matching(query: str, commands: tuple[Command, ...] = COMMANDS) -> list[Command]:
    """The commands whose name fuzzily matches ``query`` (every letter, in order): names starting
    with it first, then the better matches; all of them, in the table's order, for no query."""
    query = query.lower()
    if not query:
        return list(commands)
    matcher = Matcher(query)
    scored = [(matcher.match(c.name), c) for c in commands]
    found = [(score, c) for score, c in scored if score > 0]
    found.sort(key=lambda pair: (not pair[1].name.startswith(query), -pair[0]))
    return [c for _, c in found]


class PathMenu(OptionList, can_focus=False):
    """Options for the ``@`` word or the ``/command`` at the prompt's cursor; hidden when there is
    none. Posts :class:`Toggled` when it opens or closes."""

    DEFAULT_CSS = """
    PathMenu {
        height: auto; max-height: 7; border: none; padding: 0 1; background: $panel; display: none;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    PathMenu.-open { display: block; }
    """

    class Toggled(Message):
        def __init__(self, is_open: bool) -> None:
            super().__init__()
            self.is_open = is_open

    def show_matches(self, paths: list[str]) -> None:
        self._show([Option(Text(printable(p, single_line=True)), id=p) for p in paths])

    def show_commands(self, commands: list[Command]) -> None:
        width = max((len(c.usage) for c in commands), default=0)
        self._show(
            [
                Option(
                    Text.assemble(
                        (c.usage.ljust(width), "bold"),
                        "  ",
                        (c.description, "dim"),
                        no_wrap=True,
                        overflow="ellipsis",
                    ),
                    id=c.name,
                )
                for c in commands
            ]
        )

    def _show(self, options: list[Option]) -> None:
        was_open = self.is_open
        self.clear_options()
        self.add_options(options)
        self.set_class(bool(options), "-open")
        if options:
            self.highlighted = 0
        if self.is_open != was_open:
            self.post_message(self.Toggled(self.is_open))

    def close(self) -> None:
        was_open = self.is_open
        self.clear_options()
        self.remove_class("-open")
        if was_open:
            self.post_message(self.Toggled(False))

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
