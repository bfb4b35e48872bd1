"""Untrusted text made inert before it is shown: on a terminal, in a CI log, in Markdown.

A terminal obeys the control characters in what it prints: an escape sequence from a tool's output
or a file name can set the window title, write the clipboard (OSC 52), move the cursor and erase
lines, and a name made of backspaces hides itself. Bidirectional controls reorder what is shown.
GitHub Actions reads a log line that starts with ``::`` (after spaces) as a workflow command
(``::add-mask::``, ``::stop-commands::``) and ``##[`` anywhere in a line as one of the old form.
:func:`terminal_safe` shows all of these as visible escapes instead (``\\x1b``, ``\\u202e``,
``\\::``), and leaves every other character, ``café`` or ``漢字``, as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: Bidirectional controls: embeddings, overrides, isolates and marks.
BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"

# C0 (but tab and line feed), DEL, C1, the line and paragraph separators, bidi controls, and lone
# surrogates (a byte that is not UTF-8, from a ``surrogateescape`` decoding, cannot be encoded).
_UNSAFE = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u2028\\u2029{BIDI_CONTROLS}\\ud800-\\udfff]")
_UNSAFE_ONE_LINE = re.compile(f"[\\t\\n{_UNSAFE.pattern[1:-1]}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
#: A workflow command: ``::`` after what the runner trims from the start of a line.
_COMMAND = re.compile(r"^([\s\u200b\ufeff]*)::", re.MULTILINE)
_OLD_COMMAND = "##["


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str, *, single_line: bool = False, workflow_commands: bool = True) -> str:
    """``text`` with every character a terminal would act on shown as a visible escape (``\\x1b``,
    ``\\x9b``, ``\\u202e``); tab and line feed stay unless ``single_line`` (file names, one-line
    fields: ``\\t``, ``\\n``). With ``workflow_commands`` (text that may reach a CI log; not for
    pieces of a line streamed one by one) no line of it reads as a GitHub Actions workflow command:
    ``::`` starting a line becomes ``\\::``, and ``##[`` becomes ``#\\#[``."""
    text = (_UNSAFE_ONE_LINE if single_line else _UNSAFE).sub(_escape, text)
    if workflow_commands:
        text = _COMMAND.sub(r"\1\\::", text).replace(_OLD_COMMAND, "#\\#[")
    return text


def shown_names(names: Iterable[str], sep: str = ", ") -> str:
    """File or test names listed on one line, each :func:`terminal_safe` with ``single_line``: a
    name made of backspaces or line breaks is still seen, and seen as one name."""
    return sep.join(terminal_safe(name, single_line=True) for name in names)
