"""A unified diff drawn with its code highlighted in the file's language, additions and removals
on tinted backgrounds, optionally folded to its first lines."""

from __future__ import annotations

import re

from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static

from clover_agent.tui.text import printable

_FILE = re.compile(r"^\+\+\+ b/(.+)$|^diff --git a/\S+ b/(.+)$")
#: The editor's own diffs name sandbox paths (``a/workspace/x.py``); shown as repository paths.
_SANDBOX_PATH = re.compile(r"^(---|\+\+\+) ([ab])/workspace/", re.MULTILINE)
TINTS = {
    True: {"+": "on #12361b", "-": "on #3d1518"},  # dark themes
    False: {"+": "on #dcf5df", "-": "on #fadcdc"},
}


def _lexer_for(path: str) -> str:
    lexer = Syntax.guess_lexer(path, code="")
    return lexer if lexer != "default" else "text"


def render_diff(diff: str, *, dark: bool = True, max_lines: int | None = None) -> Text:
    """The diff as styled text (see the module docstring)."""
    lines = _SANDBOX_PATH.sub(r"\1 \2/", printable(diff)).splitlines()
    shown = lines if max_lines is None else lines[:max_lines]
    theme = "ansi_dark" if dark else "ansi_light"
    tints = TINTS[dark]
    lexer = "text"
    out = Text()
    for line in shown:
        header = _FILE.match(line)
        if header:
            lexer = _lexer_for(header.group(1) or header.group(2))
        if line.startswith(
            ("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file", "similarity", "rename ")
        ):
            out.append(line + "\n", style="bold dim")
        elif line.startswith("@@"):
            out.append(line + "\n", style="cyan")
        elif line[:1] in ("+", "-", " "):
            code = Syntax(line[1:], lexer, theme=theme, background_color="default").highlight(line[1:])
            code.rstrip()
            row = Text(line[:1]) + code
            if line[:1] in tints:
                row.stylize(tints[line[:1]])
            out.append_text(row)
            out.append("\n")
        else:
            out.append(line + "\n", style="dim")
    if max_lines is not None and len(lines) > max_lines:
        out.append(f"… {len(lines) - max_lines} more lines", style="dim italic")
    out.rstrip()
    return out


class DiffView(Static):
    """Shows one diff; ``max_lines`` folds it (None: all of it)."""

    DEFAULT_CSS = """
    DiffView { padding: 0 1; height: auto; }
    """

    def __init__(self, diff: str, *, max_lines: int | None = None, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.diff = diff
        self.max_lines = max_lines

    def on_mount(self) -> None:
        self.refresh_diff()

    def set_diff(self, diff: str, max_lines: int | None = None) -> None:
        self.diff, self.max_lines = diff, max_lines
        self.refresh_diff()

    def refresh_diff(self) -> None:
        dark = self.app.current_theme.dark if self.is_mounted else True
        self.update(
            render_diff(self.diff, dark=dark, max_lines=self.max_lines) if self.diff else "(no changes)"
        )
