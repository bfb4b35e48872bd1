"""A generated corpus of text a rendered GitHub page does not show, in every place Markdown allows
(paragraphs, headings, lists, nested lists, quotes, table cells, footnotes, folded details),
combined and nested: a marker in each hidden part never reaches the framed request, and each
marker in the text around it does."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from clover_agent.ci.sanitize import MAX_INPUT_CHARS, frame_request, sanitize_task

Hide = Callable[[str], str]

#: Hidden constructs that fit inside a line (a table cell, a heading).
INLINE: dict[str, Hide] = {
    "comment": lambda s: f"<!-- {s} -->",
    "processing instruction": lambda s: f"<?xml {s} ?>",
    "declaration": lambda s: f"<!DOCTYPE {s}>",
    "bogus comment": lambda s: f"<!x {s}>",
    "cdata": lambda s: f"<![CDATA[ {s} ]]>",
    "image alt": lambda s: f"![{s}](pic.png)",
    "image alt and title": lambda s: f'![{s}](pic.png "{s}x")',
    "link title": lambda s: f'[link](https://example.com "{s}")',
    "html link title": lambda s: f'<a href="https://example.com" title="{s}">link</a>',
    "html image alt": lambda s: f'<img src="pic.png" alt="{s}">',
    "abbr title": lambda s: f'<abbr title="{s}">abbr</abbr>',
    "attribute value": lambda s: f'<span data-note="{s}">span</span>',
    "hidden attribute": lambda s: f"<span hidden>{s}</span>",
    "display none": lambda s: f'<span style="display:none">{s}</span>',
    "visibility hidden": lambda s: f"<b style='color:red; visibility: hidden'>{s}</b>",
    "font size zero": lambda s: f'<span style="font-size: 0px">{s}</span>',
    "aria hidden": lambda s: f'<i aria-hidden="true">{s}</i>',
    "script": lambda s: f"<script>{s}</script>",
    "style": lambda s: f"<style>{s}</style>",
    "template": lambda s: f"<template>{s}</template>",
    "noscript": lambda s: f"<noscript>{s}</noscript>",
    "hidden input": lambda s: f'<input type="hidden" value="{s}">',
    "nested same tag": lambda s: f"<span hidden><span>{s}</span> {s}x</span>",
    "comment in hidden": lambda s: f"<span hidden><!-- {s} --> {s}y</span>",
}
#: Hidden constructs that take whole lines (blocks).
BLOCK: dict[str, Hide] = {
    "multi-line comment": lambda s: f"<!--\n{s}\n\nstill hidden {s}z\n-->",
    "reference title": lambda s: f'[ref]: https://example.com "{s}"',
    "reference label": lambda s: f"[{s}]: https://example.com",
    "markdown comment": lambda s: f"[//]: # ({s})",
    "fence in comment": lambda s: f"<!--\n```\n{s}\n```\n-->",
    "fence in hidden div": lambda s: f"<div hidden>\n```\n{s}\n```\n</div>",
    "markdown in hidden div": lambda s: f"<div hidden>\n\n**{s}** and `{s}w`\n\n- {s}v\n\n</div>",
    "display none div": lambda s: f'<div style="display: none">\n\n# {s}\n\n</div>',
    "script block": lambda s: f"<script>\nlet x = 1;\n\n{s}\n</script>",
    "processing instruction block": lambda s: f"<?php\n{s}\n\n?>",
    "cdata block": lambda s: f"<![CDATA[\n{s}\n\n]]>",
    "declaration block": lambda s: f"<!DOCTYPE\n{s}>",
    "closed dialog": lambda s: f"<dialog>\n{s}\n</dialog>",
}


def _paragraph(a: str, x: str, b: str) -> str:
    return f"{a} {x} {b}"


def _heading(a: str, x: str, b: str) -> str:
    return f"## {a} {x} {b}"


def _item(a: str, x: str, b: str) -> str:
    return f"- {a} {x} {b}\n- other"


def _nested(a: str, x: str, b: str) -> str:
    return f"1. top\n   - {a} {x} {b}"


def _quote(a: str, x: str, b: str) -> str:
    return f"> {a} {x} {b}"


def _cell(a: str, x: str, b: str) -> str:
    return f"| h1 | h2 |\n| --- | --- |\n| {a} {x} | {b} |"


_NOTES = itertools.count()


def _footnote(a: str, x: str, b: str) -> str:
    label = f"n{next(_NOTES)}"  # one label a footnote: a second definition of one is not shown
    return f"see[^{label}]\n\n[^{label}]: {a} {x} {b}"


def _details(a: str, x: str, b: str) -> str:
    # Not ``x`` first: a line that starts with HTML is an HTML block, the Markdown on it not parsed.
    return f"<details><summary>{a}</summary>\n\n{b} {x}\n\n</details>"


def _quoted_item(a: str, x: str, b: str) -> str:
    return f"> - {a} {x} {b}"


INLINE_PLACES = [_paragraph, _heading, _item, _nested, _quote, _cell, _footnote, _details, _quoted_item]


def _block_top(a: str, x: str, b: str) -> str:
    return f"{a}\n\n{x}\n\n{b}"


def _block_in_item(a: str, x: str, b: str) -> str:
    inner = "\n".join(("   " + line) if line else "" for line in x.split("\n"))
    return f"1. {a}\n\n{inner}\n\n   {b}"


def _block_in_quote(a: str, x: str, b: str) -> str:
    inner = "\n".join(f"> {line}".rstrip() for line in x.split("\n"))
    return f"> {a}\n>\n{inner}\n>\n> {b}"


BLOCK_PLACES = [_block_top, _block_in_item, _block_in_quote]


class Markers:
    """Unique words: ``show`` for text the page shows, ``hide`` for text it does not."""

    def __init__(self) -> None:
        self.count = itertools.count()
        self.shown: list[str] = []
        self.hidden: list[str] = []

    def show(self) -> str:
        word = f"Shown{next(self.count):05d}q"
        self.shown.append(word)
        return word

    def hide(self) -> str:
        word = f"Hidden{next(self.count):05d}q"
        self.hidden.append(word)
        return word


def _check(raw: str, markers: Markers) -> None:
    clean = sanitize_task(raw)
    framed = frame_request(clean, "the corpus")
    # The hidden markers are built so that none is a part of another marker.
    leaked = [word for word in markers.hidden if word in framed]
    missing = [word for word in markers.shown if word not in framed]
    assert not leaked and not missing, f"{raw!r}\n{clean.text!r}\n{leaked} {missing}"


def test_every_inline_construct_in_every_place_is_hidden() -> None:
    for hide, place in itertools.product(INLINE.values(), INLINE_PLACES):
        markers = Markers()
        raw = place(markers.show(), hide(markers.hide()), markers.show())
        _check(raw, markers)


def test_every_block_construct_in_every_place_is_hidden() -> None:
    for hide, place in itertools.product(BLOCK.values(), BLOCK_PLACES):
        markers = Markers()
        raw = place(markers.show(), hide(markers.hide()), markers.show())
        _check(raw, markers)


def test_generated_documents_of_combined_and_nested_constructs() -> None:
    """Random documents: several places in a row, each holding one to three hidden constructs side
    by side or nested inside one another (a comment in a hidden span in a link title's line ...),
    with shown words between them."""
    rng = random.Random(22)
    inline, block = list(INLINE.values()), list(BLOCK.values())
    for _ in range(300):
        markers = Markers()
        parts = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.3:
                hidden = rng.choice(block)(markers.hide())
                parts.append(rng.choice(BLOCK_PLACES)(markers.show(), hidden, markers.show()))
                continue
            hidden = rng.choice(inline)(markers.hide())
            inside: list[str] = []  # the shown words in ``hidden`` so far
            for _ in range(rng.randint(0, 2)):
                if rng.random() < 0.5:  # side by side, shown text between
                    inside.append(markers.show())
                    hidden = f"{hidden} {inside[-1]} {rng.choice(inline)(markers.hide())}"
                else:  # nested: the whole inside an element that hides it, shown words included
                    hidden = f"<span hidden>{markers.hide()} {hidden}</span>"
                    for word in inside:
                        markers.shown.remove(word)
                        markers.hidden.append(word)
                    inside = []
            parts.append(rng.choice(INLINE_PLACES)(markers.show(), hidden, markers.show()))
        _check("\n\n".join(parts), markers)


def test_the_input_is_cut_before_parsing_without_showing_what_the_cut_splits() -> None:
    """A megabyte is read only to MAX_INPUT_CHARS; the cut goes back to a blank line, so a comment
    that the cut would leave unclosed inside a paragraph (shown as text, then) is cut away whole."""
    markers = Markers()
    first = markers.show()
    filler = "<!-- " + "words " * ((MAX_INPUT_CHARS - 200) // 6) + " -->"  # hidden: the text stays short
    hidden = markers.hide()
    raw = f"{first}\n\n{filler}\n\nlast paragraph <!-- {hidden} " + "x " * 500_000 + " -->"
    clean = sanitize_task(raw)
    assert first in clean.text and hidden not in clean.text
    assert len(clean.text) < 1000
    assert clean.truncated and clean.original_chars == len(raw)
    assert "the request was cut here" in clean.text
    late = markers.show()
    clean = sanitize_task("a\n\n" + "b " * MAX_INPUT_CHARS + f"\n\n{late}")
    assert late not in clean.text and clean.truncated  # only the first part is read
