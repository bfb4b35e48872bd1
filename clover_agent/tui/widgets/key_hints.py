"""The bottom line: the keys that matter now — idle, while the agent runs, while an approval waits,
while the completion menu is open, and those of the dialog on top. One line, redrawn only when the
state changes."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

HINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "idle": (
        ("enter", "send"),
        ("/", "commands"),
        ("@", "files"),
        ("?", "keys"),
        ("ctrl+p", "palette"),
        ("ctrl+c", "clear/quit"),
        ("shift+tab", "plan"),
    ),
    "running": (
        ("esc", "interrupt"),
        ("enter", "queue a message"),
        ("ctrl+t", "thinking"),
        ("ctrl+o", "expand output"),
    ),
    "approval": (
        ("y", "allow once"),
        ("a", "always (see its scope)"),
        ("n / esc", "deny"),
        ("f", "deny, say why"),
    ),
    "menu": (("↑↓", "choose"), ("tab / enter", "complete"), ("esc", "close")),
    # the dialogs: the line follows the screen on top
    "apply": (("↑↓", "file"), ("space", "accept / reject"), ("enter", "apply accepted"), ("esc", "cancel")),
    "view": (("pgup / pgdn", "scroll"), ("esc", "close")),
    "picker": (("↑↓", "choose"), ("enter", "pick"), ("esc", "cancel")),
    "quit": (("q", "quit anyway"), ("a", "review and apply"), ("esc", "stay")),
    "plan": (("a", "approve"), ("e", "edit"), ("r", "reject"), ("l", "leave plan mode"), ("esc", "later")),
}


class KeyHints(Static):
    """Shows the :data:`HINTS` of one state (:meth:`show_state`)."""

    DEFAULT_CSS = """
    KeyHints { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(_line("idle"), id=id)
        self.state = "idle"

    def show_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.update(_line(state))


def _line(state: str) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    for index, (key, what) in enumerate(HINTS[state]):
        if index:
            line.append("  ")
        line.append(key, style="bold")
        line.append(f" {what}")
    return line
