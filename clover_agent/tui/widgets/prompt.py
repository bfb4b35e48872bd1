"""The prompt: a multi-line box where Enter sends, with a history and ``@path`` completion.

Enter sends the text (a request or a ``/command``); ctrl+j, shift+enter or alt+enter insert a new
line. Up on the first line and Down on the last walk the history of sent texts. Typing ``@`` and a
few letters opens the :class:`PathMenu` of matching repository files (Tab or Enter picks one); Tab
never moves the focus away. A cleared prompt's text goes to the history too.
"""

from __future__ import annotations

import re

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from clover_agent.tui.widgets.path_menu import PathMenu, matching

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
_MENTION_AT_END = re.compile(r"(?:^|\s)@([\w./-]*)$")


class PromptBox(TextArea):
    """See the module docstring. ``files``: repository paths for completion (set by the app)."""

    DEFAULT_CSS = """
    PromptBox { height: auto; min-height: 3; max-height: 8; border: round $primary 60%; padding: 0 1; }
    PromptBox:focus { border: round $accent; }
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, menu: PathMenu, *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            "",
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            placeholder=placeholder,
            highlight_cursor_line=False,
            compact=True,
            id=id,
        )
        self.menu = menu
        self.files: list[str] = []
        self.sent: list[str] = []  # texts sent, oldest first
        self._history_index: int | None = None  # position while walking the history
        self._draft = ""

    # -- keys ----------------------------------------------------------------------------------------

    async def _on_key(self, event: events.Key) -> None:
        if self.menu.is_open and event.key in ("enter", "tab"):
            event.stop()
            event.prevent_default()
            self._complete()
            return
        if self.menu.is_open and event.key == "escape":
            event.stop()
            event.prevent_default()
            self.menu.close()
            return
        if event.key in ("tab", "shift+tab"):  # only completes: the focus stays here
            event.stop()
            event.prevent_default()
            return
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.submit()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def action_cursor_up(self, select: bool = False) -> None:
        if self.menu.is_open and not select:
            self.menu.move(-1)
        elif not select and self.cursor_location[0] == 0 and self.sent:
            self._walk_history(-1)
        else:
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if self.menu.is_open and not select:
            self.menu.move(1)
        elif (
            not select
            and self.cursor_location[0] == self.document.line_count - 1
            and self._history_index is not None
        ):
            self._walk_history(1)
        else:
            super().action_cursor_down(select)

    # -- sending and history ---------------------------------------------------------------------------

    def submit(self) -> None:
        text = self.text.strip()
        if not text:
            return
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._history_index = None
        self.clear()
        self.menu.close()
        self.post_message(self.Submitted(text))

    def clear_keeping_history(self) -> bool:
        """Empty the prompt; its text goes to the history (Up brings it back). False when empty."""
        text = self.text
        if not text.strip():
            return False
        if not self.sent or self.sent[-1] != text.strip():
            self.sent.append(text.strip())
        self._history_index = None
        self.clear()
        self.menu.close()
        return True

    def _walk_history(self, delta: int) -> None:
        if self._history_index is None:
            self._draft = self.text
            index = len(self.sent) + delta
        else:
            index = self._history_index + delta
        if index >= len(self.sent):
            self._history_index = None
            self.load_text(self._draft)
        else:
            self._history_index = max(0, index)
            self.load_text(self.sent[self._history_index])
        self.move_cursor(self.document.end)

    # -- @path completion ------------------------------------------------------------------------------

    def _mention_before_cursor(self) -> re.Match[str] | None:
        row, column = self.cursor_location
        line = self.document.get_line(row)[:column]
        return _MENTION_AT_END.search(line)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        mention = self._mention_before_cursor()
        if mention is None or not self.files:
            self.menu.close()
            return
        self.menu.show_matches(matching(self.files, mention.group(1)))

    def _complete(self) -> None:
        chosen = self.menu.chosen
        mention = self._mention_before_cursor()
        self.menu.close()
        if chosen is None or mention is None:
            return
        row, column = self.cursor_location
        start = (row, column - len(mention.group(1)))
        self.replace(chosen + " ", start, (row, column))
