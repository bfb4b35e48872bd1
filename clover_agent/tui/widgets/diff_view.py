"""A unified diff drawn with its code highlighted in the file's language, additions and removals
on tinted backgrounds, optionally folded to its first lines.

Every foreground is made readable against the background it is drawn on (the line's tint, or the
widget's own background in the theme of the moment): a colour under WCAG AA contrast (4.5:1) is
moved towards black or white until it passes. The view redraws when the theme changes.
"""

from __future__ import annotations

import re

from rich.color import Color as RichColor
from rich.color_triplet import ColorTriplet
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Span, Text
from textual.color import Color
from textual.widget import Widget

from clover_agent.tui.text import printable

_FILE = re.compile(r"^\+\+\+ b/(.+)$|^diff --git a/\S+ b/(.+)$")
#: The editor's own diffs name sandbox paths (``a/workspace/x.py``); shown as repository paths.
_SANDBOX_PATH = re.compile(r"^(---|\+\+\+) ([ab])/workspace/", re.MULTILINE)
_HEADERS = ("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file", "similarity", "rename ")
#: The contrast every foreground reaches against its background (WCAG 2 AA for normal text).
MIN_CONTRAST = 4.5
#: Per theme kind (dark or not): the tints of added and removed lines, the colours of the markers
#: and hunk headers, and the Pygments style of the code (each colour then made readable).
PALETTES = {
    True: {
        "+": "#12361b",
        "-": "#3d1518",
        "+mark": "#7ee787",
        "-mark": "#ffa198",
        "@@": "#58d1eb",
        "code": "monokai",
    },
    False: {
        "+": "#dcf5df",
        "-": "#fadcdc",
        "+mark": "#116329",
        "-mark": "#82071e",
        "@@": "#005f87",
        "code": "default",
    },
}
DEFAULT_BACKGROUND = {True: "#1e1e1e", False: "#f5f5f5"}
DEFAULT_FOREGROUND = {True: "#e0e0e0", False: "#1f1f1f"}


def luminance(rgb: ColorTriplet) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""

    def linear(channel: int) -> float:
        value = channel / 255
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4

    return 0.2126 * linear(rgb.red) + 0.7152 * linear(rgb.green) + 0.0722 * linear(rgb.blue)


def contrast(first: ColorTriplet, second: ColorTriplet) -> float:
    """WCAG 2 contrast ratio of two colours (1 to 21)."""
    lighter, darker = sorted((luminance(first), luminance(second)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def readable(color: ColorTriplet, background: ColorTriplet, minimum: float = MIN_CONTRAST) -> ColorTriplet:
    """``color``, or the nearest mix of it with black or white (whichever contrasts more with
    ``background``) that reaches ``minimum`` against ``background``."""
    if contrast(color, background) >= minimum:
        return color
    white, black = ColorTriplet(255, 255, 255), ColorTriplet(0, 0, 0)
    end = white if contrast(white, background) >= contrast(black, background) else black
    for step in range(1, 21):
        share = step / 20
        mixed = ColorTriplet(
            *(round(c + (e - c) * share) for c, e in zip(color, end, strict=True))  # towards the end
        )
        if contrast(mixed, background) >= minimum:
            return mixed
    return end


def _triplet(color: str | Color) -> ColorTriplet:
    parsed = Color.parse(color) if isinstance(color, str) else color
    return ColorTriplet(parsed.r, parsed.g, parsed.b)


def _lexer_for(path: str) -> str:
    lexer = Syntax.guess_lexer(path, code="")
    return lexer if lexer != "default" else "text"


def _styled(text: Text, fg: ColorTriplet, bg: ColorTriplet, tint: ColorTriplet | None) -> Text:
    """``text`` with every colour readable on ``bg``; ``tint`` (when given) becomes its background."""
    base = Style(color=RichColor.from_triplet(readable(fg, bg)), bgcolor=_rich(tint))
    spans = []
    for span in text.spans:
        style = span.style if isinstance(span.style, Style) else Style.parse(span.style)
        color = style.color.triplet if style.color is not None else None
        style = Style(
            color=None if color is None else RichColor.from_triplet(readable(color, bg)),
            bold=style.bold,
            italic=style.italic,
            underline=style.underline,
        )  # its own background, dim and the like are dropped: they would change the contrast
        spans.append(Span(span.start, span.end, style))
    out = Text(text.plain, style=base, end="")
    out.spans = spans
    return out


def _rich(color: ColorTriplet | None) -> RichColor | None:
    return None if color is None else RichColor.from_triplet(color)


def render_diff(
    diff: str,
    *,
    dark: bool = True,
    background: Color | str | None = None,
    foreground: Color | str | None = None,
    max_lines: int | None = None,
) -> Text:
    """The diff as styled text (see the module docstring), for a widget of ``background`` and
    ``foreground`` (default: typical ones of a dark or light theme)."""
    palette = PALETTES[dark]
    bg = _triplet(background if background is not None else DEFAULT_BACKGROUND[dark])
    fg = _triplet(foreground if foreground is not None else DEFAULT_FOREGROUND[dark])
    muted = ColorTriplet(*(round(f + (b - f) * 0.3) for f, b in zip(fg, bg, strict=True)))
    lines = _SANDBOX_PATH.sub(r"\1 \2/", printable(diff)).splitlines()
    shown = lines if max_lines is None else lines[:max_lines]
    lexer = "text"
    out = Text()
    for line in shown:
        header = _FILE.match(line)
        if header:
            lexer = _lexer_for(header.group(1) or header.group(2))
        if line.startswith(_HEADERS):
            row = _styled(Text(line, style="bold"), muted, bg, None)
        elif line.startswith("@@"):
            row = _styled(Text(line), _triplet(palette["@@"]), bg, None)
        elif line[:1] in ("+", "-", " "):
            marker = line[:1]
            tint = _triplet(palette[marker]) if marker in ("+", "-") else None
            code = Syntax(line[1:], lexer, theme=palette["code"], background_color="default").highlight(
                line[1:]
            )
            code.rstrip()
            mark = Text(" ")
            if tint:
                mark = Text()
                mark.append(marker, Style(color=palette[f"{marker}mark"], bold=True))
            row = _styled(mark + code, fg, tint or bg, tint)
        else:
            row = _styled(Text(line, style="italic"), muted, bg, None)
        out.append_text(row)
        out.append("\n")
    if max_lines is not None and len(lines) > max_lines:
        out.append_text(
            _styled(Text(f"… {len(lines) - max_lines} more lines", style="italic"), muted, bg, None)
        )
    out.rstrip()
    return out


class DiffView(Widget):
    """Shows one diff; ``max_lines`` folds it (None: all of it). Drawn in the colours of the
    widget and theme of the moment (see the module docstring)."""

    DEFAULT_CSS = """
    DiffView { padding: 0 1; height: auto; }
    """

    def __init__(self, diff: str, *, max_lines: int | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.diff = diff
        self.max_lines = max_lines

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(
            self, lambda _theme: self.call_after_refresh(self.refresh_diff)
        )

    def set_diff(self, diff: str, max_lines: int | None = None) -> None:
        self.diff, self.max_lines = diff, max_lines
        self.refresh_diff()

    def refresh_diff(self) -> None:
        self.refresh(layout=True)

    def render(self) -> Text:
        if not self.diff:
            return Text("(no changes)")
        _, _, background, foreground = self.colors
        dark = self.app.current_theme.dark
        return render_diff(
            self.diff, dark=dark, background=background, foreground=foreground, max_lines=self.max_lines
        )
