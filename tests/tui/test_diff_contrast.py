"""Diffs are readable in both themes: every character of a diff, wherever the app draws one (an
edit's card, the approval dialog, /diff, /apply), has a foreground of WCAG AA contrast (4.5:1)
against the background it is drawn on. The colours are read from what the running app renders
(its line filters applied), in the dark and the light theme and after F2 switches between them;
the contrast ratio is computed here from the WCAG 2 definition."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.color_triplet import ColorTriplet
from textual.geometry import Region
from textual.pilot import Pilot

from clover_agent.session.events import ApprovalNeeded
from clover_agent.tui.app import CloverApp
from clover_agent.tui.handback import FileChange
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.diff import DiffScreen
from clover_agent.tui.widgets.diff_view import DiffView
from tests.tui.test_snapshots import DIFF, _app, _settled

AA = 4.5
#: Every kind of line a diff has: git headers, a hunk header, context, removed, added, a note.
EVERY_KIND = (
    "diff --git a/calculator.py b/calculator.py\nindex 3b18e51..a8c2f4b 100644\n"
    + DIFF
    + '-    raise ValueError("nope")\n+    return {"sum": a + b}  # a comment\n\\ No newline at end of file\n'
)


def _linear(channel: int) -> float:
    # WCAG 2.x relative luminance: sRGB channel to linear light
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _luminance(rgb: ColorTriplet) -> float:
    return 0.2126 * _linear(rgb.red) + 0.7152 * _linear(rgb.green) + 0.0722 * _linear(rgb.blue)


def contrast_ratio(a: ColorTriplet, b: ColorTriplet) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_ratio_is_the_wcag_one() -> None:
    black, white = ColorTriplet(0, 0, 0), ColorTriplet(255, 255, 255)
    assert round(contrast_ratio(black, white), 2) == 21.0
    assert round(contrast_ratio(white, white), 2) == 1.0
    assert 4.4 < contrast_ratio(ColorTriplet(118, 118, 118), white) < 4.6  # #767676: the AA grey


def _pairs(app: CloverApp) -> list[tuple[str, ColorTriplet, ColorTriplet, float]]:
    """Each drawn piece of text of every diff on the screen: (text, fg, bg, ratio)."""
    seen = []
    views = list(app.screen.query(DiffView))
    assert views, "no diff on the screen"
    for view in views:
        for strip in view.render_lines(Region(0, 0, view.size.width, view.size.height)):
            for segment in strip:
                if not segment.text.strip():
                    continue
                style = segment.style
                assert style is not None and not style.dim, segment  # dim: the terminal decides
                assert style.color is not None and style.bgcolor is not None, segment
                fg, bg = style.color.triplet, style.bgcolor.triplet
                assert fg is not None and bg is not None, segment  # resolved to RGB, not ANSI names
                seen.append((segment.text, fg, bg, contrast_ratio(fg, bg)))
    return seen


def _check(app: CloverApp, where: str) -> set[ColorTriplet]:
    pairs = _pairs(app)
    poor = [(t, f"#{fg.hex[1:]}", f"#{bg.hex[1:]}", round(r, 2)) for t, fg, bg, r in pairs if r < AA]
    assert not poor, f"{where} ({app.current_theme.name}): under {AA}:1: {poor}"
    return {bg for _, _, bg, _ in pairs}


async def _each_place(pilot: Pilot, app: CloverApp) -> None:
    """The card in the transcript, then the approval dialog, /diff and /apply, each checked."""
    backgrounds = _check(app, "the edit's card")
    assert len(backgrounds) >= 3  # the card's own, the removed and the added line's
    request = ApprovalNeeded(call_id="c9", name="editor", arguments={"command": "str_replace",
                             "path": "/workspace/calculator.py"}, reason="policy 'ask'", preview=EVERY_KIND)  # fmt: skip
    for screen in (
        ApprovalScreen(request),
        DiffScreen(EVERY_KIND),
        ApplyScreen([FileChange("calculator.py", EVERY_KIND, "modified", 2, 2)]),
    ):
        await app.push_screen(screen)
        await pilot.pause()
        assert len(_check(app, type(screen).__name__)) >= 3
        screen.dismiss(None)
        await pilot.pause()


@pytest.mark.slow
@pytest.mark.parametrize("theme", ["dark", "light"])
async def test_every_diff_colour_passes_aa_in_both_themes(tmp_path: Path, theme: str) -> None:
    app = _app(tmp_path, theme)
    async with app.run_test(size=(100, 40)) as pilot:
        await _settled(pilot)
        assert app.current_theme.dark == (theme == "dark")
        await _each_place(pilot, app)
        await pilot.press("f2")  # the other theme: the diffs already drawn are redrawn in it
        await pilot.pause()
        assert app.current_theme.dark != (theme == "dark")
        await _each_place(pilot, app)
        await pilot.press("ctrl+q")
