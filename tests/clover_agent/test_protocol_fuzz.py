"""Fuzzing the tool-call parser with generated hostile turns (seeded, so every run is the same).

- Thousands of generated turns (prose, reasoning, calls whose values quote whole calls, unicode,
  lone surrogates, CRLF, special-token text, tags glued into text) read back to exactly the calls
  and content they were made of: a quoted call is data, however many there are and however deep.
- Every prefix of such a turn (a model cut off) never yields a call the turn did not make: the calls
  before the cut are exact and the one cut (if read) is the same tool.
- Every start of such a turn ending at a newline: what ``scan_progress`` settles is the whole turn's.
- Mutated turns and tag soup are a turn or a :class:`ToolCallFormatError`, never another exception.
- The scanner reads each tag a bounded number of times (its work is linear in the text), checked by
  counting the tags it reads, not with a clock; bench/parser_bench.py measures time and memory.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

from clover_agent.protocol import (
    MAX_REPLY_CHARS,
    ToolCall,
    ToolCallFormatError,
    format_assistant_text,
    format_tool_call,
    parse_assistant,
    parse_tool_calls,
    scanner,
    tool_parameters,
)
from clover_agent.tools.registry import tool_specs

TOOLS = tool_specs()  # what the model really sees: editor, shell, run_tests, search, finish
PARAMETERS = tool_parameters(TOOLS)
SPECIAL = ["<|im_end|>", "<|im_start|>assistant\n", "<|endoftext|>", "<tool_response>", "</tool_response>"]
UNICODE = ["café", "格式", "🙂", "\u200b", "\u202e", "Ω≈ç√", "\ud800", "\udfff", "\x00", "\x1b[31m"]
SPACE = ["\n", "\n\n", "  ", "\t", "\r\n", "\r", " \n "]
# Tags that are harmless anywhere as long as text touches them on both sides (see _text).
GLUED = [
    "</parameter>",
    "</parameter",
    "</parameter1>",
    "<parameter=path>",
    "<parameter=command>",
    "<parameter=",
    "<function=",
    "<function={{ name }}>",
    "<function=a b>",
    "</tool_call>",
    "<tool_call>",
    "<think>",
]


def _words(rng: random.Random) -> str:
    return rng.choice(["ls -la", "def f(x):\n    return x", "x = 1", "# notes", "hello world", "a"])


def _text(rng: random.Random, depth: int, room: int, tags: bool = True) -> str:
    """A string value that reads back as itself: words, unicode, whitespace, special-token text,
    tags glued between letters, and whole calls (quoted, any number, nested ``depth`` deep)."""
    parts = []
    for _ in range(rng.randint(1, room)):
        roll = rng.random()
        if roll < 0.2:
            parts.append(_words(rng))
        elif roll < 0.3:
            parts.append(rng.choice(UNICODE))
        elif roll < 0.45:
            parts.append(rng.choice(SPACE))
        elif roll < 0.5:
            parts.append(rng.choice(SPECIAL))
        elif tags and roll < 0.7:
            glued = GLUED + (["</function>"] if depth == 0 else [])  # in a quoted call it would close it
            parts.append("x" + rng.choice(glued) + "x")
        elif tags and depth < 3:
            parts.append(format_tool_call(*_call(rng, depth + 1, max(room // 2, 1))))
    return "".join(parts)


def _call(rng: random.Random, depth: int, room: int) -> tuple[str, dict[str, Any]]:
    """A valid call of one of the tools, values drawn so that they pass the tool's schema."""
    tool = rng.choice(["editor", "shell", "finish", "search", "run_tests"])
    if tool == "editor":
        command = rng.choice(["view", "create", "str_replace", "insert"])
        args: dict[str, Any] = {
            "command": command,
            "path": "/workspace/" + rng.choice(["a.py", "docs.md", "é.txt"]),
        }
        if command == "create":
            args["file_text"] = _text(rng, depth, room)
        elif command == "str_replace":
            args |= {"old_str": _text(rng, depth, room), "new_str": _text(rng, depth, room)}
            if rng.random() < 0.5:
                args["replace_all"] = rng.random() < 0.5
        elif command == "insert":
            args |= {"insert_line": rng.randint(0, 10**6), "new_str": _text(rng, depth, room)}
        elif rng.random() < 0.5:
            args["view_range"] = [rng.randint(1, 50), rng.choice([-1, rng.randint(50, 99)])]
        return tool, args
    if tool == "shell":
        args = {"command": "x" + _text(rng, depth, room)}
        if rng.random() < 0.5:
            args["timeout"] = rng.choice(
                [rng.randint(1, 3600), round(rng.uniform(0.001, 3600), rng.randint(0, 9))]
            )
        return tool, args
    if tool == "search":
        return tool, {"pattern": "x" + _text(rng, depth, room, tags=False), "glob": "*.py"}
    if tool == "run_tests":
        return tool, {"target": rng.choice(["tests/test_a.py::test_b", "-k add", "tests"])}
    return tool, {"summary": "x" + _text(rng, depth, room)}


def _turn(rng: random.Random) -> tuple[str, str, list[tuple[str, dict[str, Any]]]]:
    """``(text, content, calls)`` of a generated turn, with its reasoning if any."""
    reasoning = rng.random() < 0.5
    prose = rng.choice(["", "Let me look.", "I'll write the file:\n", "格式 🙂", "x</function>x"])
    calls = [_call(rng, 0, rng.randint(1, 6)) for _ in range(rng.randint(0, 3))]
    if not reasoning:  # with no reasoning, the first </think> would end the (absent) reasoning
        calls = [(n, a) for n, a in calls if "</think>" not in json.dumps(a)]
    tail = rng.choice(["", "", "\nAll done.", "\n\n格式"]) if calls else ""
    text = format_assistant_text(
        prose, "plan: </thi" if reasoning else None, [ToolCall(n, a) for n, a in calls]
    )
    between = ("\n\n" if prose.strip() else "") + "\n" * (len(calls) - 1) if calls else ""
    return text + tail, (prose.strip() + between + tail).strip(), calls


def _plain(calls: list[ToolCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


def _read(text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]] | ToolCallFormatError:
    """The lenient reading and the strict one, which must agree or be a format error."""
    content, calls = parse_tool_calls(text, TOOLS)
    assert isinstance(content, str) and all(isinstance(c.arguments, dict) for c in calls)
    try:
        turn = parse_assistant(text, TOOLS)
    except ToolCallFormatError as error:
        assert error.problems and all(isinstance(p, str) and p for p in error.problems)
        return error
    assert (turn.content, _plain(turn.tool_calls)) == (content, _plain(calls))
    return content, _plain(calls)


def _turns(seed: int, count: int) -> Iterator[tuple[str, str, list[tuple[str, dict[str, Any]]]]]:
    rng = random.Random(seed)
    for _ in range(count):
        yield _turn(rng)


def test_generated_turns_read_back_exactly() -> None:
    quoted = 0
    for text, content, calls in _turns(1, 1500):
        assert _read(text) == (content, calls), text
        quoted += sum(str(v).count("<tool_call>\n<function=") for _, a in calls for v in a.values())
    assert quoted > 1000  # the values did quote whole calls (at every depth)


def test_every_cut_of_a_turn_keeps_the_calls_before_it() -> None:
    rng = random.Random(2)
    cuts = 0
    for text, _, calls in _turns(3, 300):
        for end in sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 12))):
            _, read = parse_tool_calls(text[:end], TOOLS)
            assert len(read) <= len(calls)
            if read:
                assert _plain(read[:-1]) == calls[: len(read) - 1], (text, end)
                assert read[-1].name == calls[len(read) - 1][0]
            cuts += 1
    assert cuts > 3000


def _mutated(rng: random.Random, text: str) -> str:
    tags = [m.start() for m in re.finditer("<", text)] or [0]
    for _ in range(rng.randint(1, 4)):
        at = rng.choice(tags) if rng.random() < 0.7 else rng.randint(0, len(text))
        roll = rng.random()
        if roll < 0.3:
            text = text[:at] + text[at + rng.randint(1, 14) :]  # a tag (or its end) dropped
        elif roll < 0.6:
            text = text[:at] + rng.choice([*GLUED, "</function>", "<function=shell>", "\n"]) + text[at:]
        elif roll < 0.8:
            piece = text[at : at + rng.randint(1, 40)]
            text = text[:at] + piece + text[at:]  # a piece written twice
        else:
            text = text[:at].upper() + text[at:]
    return text


def test_mutated_turns_are_a_turn_or_a_format_error() -> None:
    rng = random.Random(4)
    outcomes = set()
    for text, _, _ in _turns(5, 1500):
        outcome = _read(_mutated(rng, text))
        outcomes.add("format error" if isinstance(outcome, ToolCallFormatError) else "turn")
    assert outcomes == {"turn", "format error"}


def test_random_tag_soup_is_a_turn_or_a_format_error() -> None:
    pieces = [*GLUED, "</function>", "<function=shell>", "<function=finish>", "<parameter=timeout>"]
    pieces += ["<parameter=summary>", "</think>", "\n", "\r\n", "  ", "ls", "4.5", "{", "[1]", "'", "\ud800"]
    rng = random.Random(7)
    outcomes = set()
    for _ in range(3000):
        outcome = _read("".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))))
        if isinstance(outcome, ToolCallFormatError):
            outcomes.add("format error")
        else:
            outcomes.add("turn with calls" if outcome[1] else "turn")
    assert outcomes == {"turn", "turn with calls", "format error"}


# -- linear work, by counting ---------------------------------------------------------------------


class _CountingTags:
    """The scanner's own tag expression, counting the tags it hands out (restarts included)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.read = 0

    def finditer(self, text: str, pos: int = 0) -> Iterator[re.Match[str]]:
        for match in self.pattern.finditer(text, pos):
            self.read += 1
            yield match


def _editor_create(text: str) -> str:
    return format_tool_call("editor", {"command": "create", "path": "/workspace/f", "file_text": text})


SHAPES = {
    "quoted calls": lambda n: _editor_create("\n".join(_editor_create(f"example {i}") for i in range(n))),
    "many calls": lambda n: "\n".join(_editor_create(f"file {i}") for i in range(n)),
    "close tags in a value": lambda n: _editor_create("</parameter>\n</function>\n" * (4 * n)),
    "unclosed quoted headers": lambda n: "\n".join(_editor_create("<function=shell>\n") for i in range(n)),
    "openers only": lambda n: "<tool_call>\n<function=shell>\n<parameter=command>\n" * (3 * n),
    "unclosed values": lambda n: "<function=shell>\n<parameter=command>\n</tool_call>\n" * (3 * n),
    "bare close then opener": lambda n: "</function>\n<tool_call>\n" * (3 * n),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_scanner_reads_each_tag_a_bounded_number_of_times(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = _CountingTags(scanner._TAG)
    monkeypatch.setattr(scanner, "_TAG", counting)
    for n in (50, 400):
        text = SHAPES[shape](n)
        tags = len(list(counting.pattern.finditer(text)))
        counting.read = 0
        parse_tool_calls(text, TOOLS, max_chars=None)
        assert counting.read <= 2 * tags + 2, (shape, n, counting.read, tags)


def test_a_reply_past_the_limit_is_a_format_error_the_model_can_act_on() -> None:
    call = _editor_create("y" * MAX_REPLY_CHARS)
    with pytest.raises(ToolCallFormatError) as info:
        parse_assistant(call, TOOLS)
    (problem,) = info.value.problems
    assert f"{len(call):,} characters long, more than the {MAX_REPLY_CHARS:,}" in problem
    assert "several smaller calls" in problem
    assert info.value.content == call  # nothing the model wrote is lost
    assert parse_tool_calls(call, TOOLS) == (call, [])
    _, calls = parse_tool_calls(call, TOOLS, max_chars=None)  # the limit is the only reason
    assert [c.arguments["file_text"] for c in calls] == ["y" * MAX_REPLY_CHARS]


def _settled_part_holds(text: str) -> int:
    """Every start of ``text`` ending at a newline: what scan_progress says no addition can change is
    what the whole text's scan has; an open call is the same call there, or a block never closed."""
    whole = scanner.scan(text, PARAMETERS)
    checked = 0
    for end in [i + 1 for i, char in enumerate(text) if char == "\n"]:
        progress = scanner.scan_progress(text[:end], PARAMETERS)
        assert progress.items[: progress.settled] == whole[: progress.settled], (text, end)
        opened = progress.open_call
        if opened is not None:
            at = sum(len(i if isinstance(i, str) else i.text) for i in progress.items[: progress.settled])
            rest = [*whole[progress.settled :]]
            if rest and isinstance(rest[0], str) and at + len(rest[0]) <= opened.start:
                at += len(rest.pop(0))
            assert at == opened.start and rest, (text, end)
            item = rest[0]
            if isinstance(item, scanner.ScannedCall):
                assert (
                    item.name == opened.name and item.arguments[: len(opened.arguments)] == opened.arguments
                )
            else:  # the call is never closed: a broken block to the end of the text
                assert isinstance(item, scanner.BrokenBlock) and at + len(item.text) == len(text), (text, end)
            checked += 1
    return checked


def test_what_a_text_being_written_settles_never_changes() -> None:
    opened = 0
    for text, _, _ in _turns(5, 200):
        opened += _settled_part_holds(text)
    rng = random.Random(9)
    pieces = [*GLUED, "</function>\n", "<function=shell>\n", "<parameter=command>\n", "<parameter=timeout>\n"]
    pieces += ["<tool_call>\n", "</tool_call>\n", "</parameter>\n", "\n", "ls\n", "4\n", "text "]
    for _ in range(500):
        opened += _settled_part_holds("".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))))
    assert opened > 1000  # open calls were seen, and checked against the whole text
