"""``terminal_safe``: every character a terminal or a CI runner acts on is shown, nothing else changes."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.events import (
    ApprovalDecided,
    ContextCondensed,
    Done,
    ErrorReported,
    ModelDelta,
    ModelResponded,
    PhaseStarted,
    SandboxProgress,
    TaskResumed,
    TaskStarted,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.fix.console import ConsoleRenderer, make_console, question_text
from clover_agent.safe_text import BIDI_CONTROLS, shown_names, terminal_safe

C0 = [chr(c) for c in range(0x20)]
C1 = [chr(c) for c in range(0x80, 0xA0)]
SHORT = {"\t": r"\t", "\n": r"\n", "\r": r"\r"}


def acted_on(char: str) -> bool:
    """The oracle, from Unicode's own tables: controls, line and paragraph separators, surrogates,
    the explicit bidi formatting characters and the three bidi marks."""
    return (
        unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs")
        or unicodedata.bidirectional(char) in ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI")
        or char in "\u200e\u200f\u061c"  # left-to-right, right-to-left and Arabic letter marks
    )


def escaped(char: str) -> str:
    code = ord(char)
    if char in SHORT:
        return SHORT[char]
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def test_every_c0_c1_and_del_is_a_visible_escape() -> None:
    for char in [*C0, "\x7f", *C1]:
        expected = SHORT.get(char, f"\\x{ord(char):02x}")
        assert terminal_safe(f"a{char}b", single_line=True) == f"a{expected}b"
        if char not in "\n\t":
            assert terminal_safe(f"a{char}b") == f"a{expected}b"
    assert terminal_safe("one\n\ttwo") == "one\n\ttwo"  # multi-line text keeps its lines and tabs
    assert (
        terminal_safe("\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07") == r"\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07"
    )
    assert terminal_safe("odd\b\b\b.py", single_line=True) == r"odd\x08\x08\x08.py"


@pytest.mark.parametrize("char", [*sorted(BIDI_CONTROLS), "\u2028", "\u2029"])
def test_bidi_controls_and_line_separators_are_escaped(char: str) -> None:
    assert terminal_safe(f"x{char}y") == f"x\\u{ord(char):04x}y"
    assert terminal_safe(f"x{char}y", single_line=True) == f"x\\u{ord(char):04x}y"


def test_a_byte_that_is_not_utf8_shows_as_that_byte() -> None:
    name = b"bad\x9b\xff.py".decode("utf-8", "surrogateescape")
    assert terminal_safe(name, single_line=True) == r"bad\x9b\xff.py"
    assert terminal_safe("\ud800") == r"\ud800"
    terminal_safe(name).encode("utf-8")  # printable on any UTF-8 stream


def test_over_every_code_point_exactly_what_is_acted_on_changes() -> None:
    every = [chr(c) for c in range(0x110000)]
    shown = terminal_safe("".join(every), single_line=True, workflow_commands=False)
    assert shown == "".join(escaped(c) if acted_on(c) else c for c in every)
    assert set(BIDI_CONTROLS) == {c for c in every if acted_on(c) and unicodedata.category(c) == "Cf"}
    for text in (
        "café",
        "漢字とかな",
        "naïve — “quotes” ✓ ✗ → ⋯",
        "👩\u200d💻 e\u0301",
        "a [bold]b[/b] <img src=x>",
    ):
        assert terminal_safe(text) == text and terminal_safe(text, single_line=True) == text


def test_no_line_reads_as_a_workflow_command() -> None:
    text = "::add-mask::x\n  ::error::y\n\u00a0\u3000::stop-commands::tok\n\ufeff::set-output name=a::b\nok ::fine\n"
    shown = terminal_safe(text)
    assert (
        shown
        == "\\::add-mask::x\n  \\::error::y\n\u00a0\u3000\\::stop-commands::tok\n\ufeff\\::set-output name=a::b\nok ::fine\n"
    )
    assert all(not line.lstrip().lstrip("\ufeff").startswith("::") for line in shown.splitlines())
    assert terminal_safe("see ##[error]x and ###[warning]") == "see #\\#[error]x and ##\\#[warning]"
    assert "##[" not in terminal_safe("####[[##[")
    # A line break escaped on one line starts no line: only the start is a line's start.
    assert terminal_safe("a\n::b", single_line=True) == r"a\n::b"
    assert terminal_safe("::b", single_line=True) == r"\::b"
    assert terminal_safe("std::vector\n::x", workflow_commands=False) == "std::vector\n::x"
    assert terminal_safe("a::b") == "a::b"  # in a line, `::` is just text


def test_names_are_listed_one_line_each() -> None:
    assert shown_names(["calc.py", "tab\there.py", "new\nline.py", "\x1b[8m.py"]) == (
        r"calc.py, tab\there.py, new\nline.py, \x1b[8m.py"
    )
    assert shown_names(["a", "b"], "; ") == "a; b" and shown_names([]) == ""


def test_the_tool_command_shows_a_commands_escapes(tmp_path: Path, capsys) -> None:
    """`clover-agent tool shell` (local sandbox, a real shell): the window title and clipboard
    sequences a command prints are shown, not obeyed; `--json` keeps the output as it is."""
    arguments = json.dumps({"command": r"printf '\033]0;pwned\007\033]52;c;ZXZpbA==\007 \342\200\256x\n'"})
    command = ["tool", "shell", arguments, "--sandbox", "local", "--workdir", str(tmp_path)]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert (
        r"\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07 \u202ex" in out and "\x1b" not in out and "\u202e" not in out
    )
    assert main([*command, "--json"]) == 0
    assert "\x1b]0;pwned\x07" in json.loads(capsys.readouterr().out)["output"]


EVIL = "\x1b]0;pwned\x07\x1b[2J\b\x9b\u202e\n::add-mask::x\n##[error]y [bold]z[/] [link=https://e]l[/link]"


def test_the_console_shows_every_event_kind_inert() -> None:
    """``fix``'s console (as ``runs show`` and the CI log use it) fed every event kind it draws, each
    text field hostile: nothing it writes holds a raw control or bidi character or a line a CI
    runner reads as a workflow command, and rich markup in the texts is shown as written. The
    approval question is made the same way."""
    out = io.StringIO()
    renderer = ConsoleRenderer(make_console(out, {}), verbose=True, live=False)
    for event in (
        TaskStarted(run_id="r", command="fix", target=EVIL, repo=EVIL, sandbox="local"),
        TaskResumed(
            run_id="r",
            command="fix",
            segment=2,
            previous_exit_code=6,
            previous_outcome=EVIL,
            previous_message=EVIL,
            repo=EVIL,
            sandbox="local",
        ),
        PhaseStarted(phase=EVIL, detail=EVIL),
        SandboxProgress(message=EVIL),
        ModelDelta(step=1, kind="reasoning", text=EVIL + "\n"),
        ModelDelta(step=1, kind="text", text=EVIL + "\n"),
        ModelResponded(
            step=1,
            raw=EVIL,
            content=EVIL,
            reasoning=EVIL,
            tool_calls=[],
            format_error=None,
            prompt_tokens=1,
            completion_tokens=1,
            finish_reason="stop",
        ),
        ToolCallStarted(step=1, call_id="c", name=EVIL, arguments={EVIL: EVIL, "n": [EVIL]}),
        ApprovalDecided(step=1, call_id="c", name=EVIL, approved=False, decided_by=EVIL, reason=EVIL),
        ToolCallFinished(step=1, call_id="c", name="shell", output=EVIL, is_error=True),
        ContextCondensed(step=1, note=EVIL, dropped=[EVIL], tokens_before=2, tokens_after=1, messages=[]),
        ErrorReported(kind=EVIL, message=EVIL),
        TestsRun(phase=EVIL, target=EVIL, report={"passed": 1}),
        Done(outcome="submitted", exit_code=0, message=EVIL, summary=EVIL),
    ):
        renderer(event)
    shown = out.getvalue() + question_text(EVIL, {EVIL: EVIL}, EVIL)
    assert shown.count(r"\x1b]0;pwned\x07\x1b[2J\x08\x9b\u202e") >= 14
    assert "[bold]z[/] [link=https://e]l[/link]" in shown
    assert not [c for c in shown if unicodedata.category(c) == "Cc" and c not in "\n\t"]
    assert "\u202e" not in shown
    assert not [line for line in shown.splitlines() if line.lstrip().startswith("::") or "##[" in line]
