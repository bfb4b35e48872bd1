"""The prompt: a multi-line box where Enter sends, with a history, ``@path`` and ``/command``
completion.

Enter sends the text (a request or a ``/command``); ctrl+j, shift+enter or alt+enter insert a new
line. Up on the first line and Down on the last walk the history of sent texts. Typing ``@`` and a
few letters opens the :class:`PathMenu` of matching repository files, ``/`` first in the prompt the
menu of the commands (fuzzy: ``/ap`` finds ``/apply``); Tab or Enter picks one, Esc closes it, and
Tab never moves the focus away. ``?`` on an empty prompt opens the help. A cleared prompt's text
goes to the history too.
"""

from __future__ import annotations

import re

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from clover_agent.tui.keys import COMMANDS
from clover_agent.tui.widgets.path_menu import PathMenu, commands_matching, matching

#: The slash commands' names: one typed out is run as typed.
COMMAND_NAMES = frozenset(c.name for c in COMMANDS)
NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
_MENTION_AT_END = re.compile(r"(?:^|\s)@([\w./-]*)$")
_COMMAND_TYPED = re.compile(r"^/(\w*)$")


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
        self._completing = ""  # what the open menu completes: "path" or "command"

    # -- keys ----------------------------------------------------------------------------------------

    async def _on_key(self, event: events.Key) -> None:
        if self.menu.is_open and event.key in ("enter", "tab"):
            event.stop()
            event.prevent_default()
            typed = self.text.strip().split(maxsplit=1)[0][1:] if self.text.strip().startswith("/") else ""
            if event.key == "enter" and self._completing == "command" and typed in COMMAND_NAMES:
                # the command is typed out already: Enter runs it, whatever the menu (whose filter may
                # not have caught up with fast typing) highlights
                self.submit()
            else:
                self._complete()
            return
        if self.menu.is_open and event.key == "escape":
            event.stop()
            event.prevent_default()
            self.menu.close()
            return
        if event.character == "?" and not self.text:
            event.stop()
            event.prevent_default()
            await self.run_action("app.help")
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

    # -- @path and /command completion -----------------------------------------------------------------

    def _mention_before_cursor(self) -> re.Match[str] | None:
        row, column = self.cursor_location
        line = self.document.get_line(row)[:column]
        return _MENTION_AT_END.search(line)

    def _command_before_cursor(self) -> re.Match[str] | None:
        """The ``/name`` being typed: first in the prompt, the cursor at its end."""
        row, column = self.cursor_location
        return _COMMAND_TYPED.match(self.document.get_line(0)[:column]) if row == 0 else None

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        command = self._command_before_cursor()
        if command is not None:
            self._completing = "command"
            self.menu.show_commands(commands_matching(command.group(1)))
            return
        mention = self._mention_before_cursor()
        if mention is None or not self.files:
            self.menu.close()
            return
        self._completing = "path"
        self.menu.show_matches(matching(self.files, mention.group(1)))

    def _complete(self) -> None:
        chosen = self.menu.chosen
        typed = (
            self._command_before_cursor() if self._completing == "command" else self._mention_before_cursor()
        )
        self.menu.close()
        if chosen is None or typed is None:
            return
        row, column = self.cursor_location
        start = (row, column - len(typed.group(1)))
        self.replace(chosen + " ", start, (row, column))
