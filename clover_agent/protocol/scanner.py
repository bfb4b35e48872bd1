"""One pass over an assistant text: plain text, tool calls (names and raw values) and broken blocks.

The format has no escaping, so a value may hold the format's own tags (a file that documents the
format, a parser's tests). Tag by tag, with one tag of look-ahead, the scanner decides where a value
ends: a quoted ``<function=NAME>`` inside a value is data until its ``</function>``, and a close
ends a value only when what follows could follow it. docs/tool-call-parsing.md ("Rules") states
the rules with their reasons, and why the work and memory are linear in the text.
:func:`scan_progress` also tells what of a text still being written no addition can change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# One alternative per tag; the empty group at the end of each names its kind (``match.lastgroup``).
# Names are at most 256 characters and hold no "<", ">" or newline, so no match looks far ahead.
_TAG = re.compile(
    r"<(?:"
    r"tool_call>(?P<tc_open>)"
    r"|/tool_call>(?P<tc_close>)"
    r"|/function>(?P<fn_close>)"
    r"|function=(?:(?P<fn_name>[^<>\n]{0,256})>(?P<fn_open>)|(?P<fn_bad>))"
    # `</parameter>` and the drifted forms models write: `</parameter1>`, `</parameter_function>`,
    # and `</parameter` with the `>` missing.
    r"|/parameter(?:\w{0,32}>|(?=\s)|\Z)(?P<p_close>)"
    r"|parameter=(?:(?P<p_name>[^<>\n]{0,256})>(?P<p_open>)|(?P<p_bad>))"
    r")"
)
_BLANK = re.compile(r"\s*")
# Names with braces, quotes, spaces or angle brackets are template residue ("{{ tc.name }}"), not calls.
_NAME = re.compile(r"[\w.:\-]+")
_OPENERS = frozenset({"tc_open", "fn_open", "fn_bad"})


# The scanner's results are tuples of strings: a reply of many thousands of calls then leaves little
# for the garbage collector to walk, which kept its cost from growing faster than the reply.
class ScannedCall(NamedTuple):
    """A call as written: the tool's name, its ``(parameter, raw value)`` pairs in order, and the
    call's own text (wrapper included)."""

    name: str
    arguments: tuple[tuple[str, str], ...]
    text: str = ""


class BrokenBlock(NamedTuple):
    """A block that tried to be a call and could not be read. ``in_content``: the text stays in the
    content (it may be prose about the format), else it is taken out."""

    text: str
    problem: str
    in_content: bool = False


Item = str | ScannedCall | BrokenBlock


def scan(text: str, parameters: Mapping[str, Mapping[str, Any] | None]) -> list[Item]:
    """``text`` split into plain text, calls and broken blocks, in order. ``parameters``: tool name ->
    its parameters schema; a tool's property names tell where one of its values ends."""
    return _Scanner(text, parameters).scan()


class OpenCall(NamedTuple):
    """A wrapped call being written: where its ``<tool_call>`` starts, its name, and the parameters
    whose values have ended (the next parameter's tag was written)."""

    start: int
    name: str
    arguments: tuple[tuple[str, str], ...]


class Progress(NamedTuple):
    """:func:`scan` of a text more may be added to. ``settled``: how many of ``items`` no addition
    can change; ``open_call``: the wrapped call being written after them, as far as no addition can
    change it (an addition can only still make it a broken block: one never closed)."""

    items: list[Item]
    settled: int
    open_call: OpenCall | None


def scan_progress(text: str, parameters: Mapping[str, Mapping[str, Any] | None]) -> Progress:
    """:func:`scan`, and what of it is final when ``text`` is the start of a longer text. ``text``
    must end with a newline (or be empty): then no tag in it reads differently with more text."""
    scanner = _Scanner(text, parameters)
    items = scanner.scan()
    return Progress(items, scanner.settled, scanner.open_call)


class _ValueEnd(NamedTuple):
    """Where a value ended (``value_end`` None: it never did) and what comes after it: the next
    parameter's opening tag, or the end of the call (``call_end``), or neither (the call is cut off)."""

    value_end: int | None
    next_parameter: re.Match[str] | None = None
    call_end: int | None = None


class _Tokens:
    """The tags of a text in order, with one of look-ahead. ``exhausted``: someone was told there
    are no more tags (a decision that more text could change)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self.exhausted = False
        self.restart(0)

    def restart(self, pos: int) -> None:
        self._iter = _TAG.finditer(self._text, pos)
        self._next = next(self._iter, None)

    def peek(self) -> re.Match[str] | None:
        self.exhausted |= self._next is None
        return self._next

    def take(self) -> re.Match[str] | None:
        tag = self.peek()
        if tag is not None:
            self._next = next(self._iter, None)
        return tag


def _parameter_name(tag: re.Match[str]) -> str:
    """The name of a ``<parameter=NAME>`` tag ("" for any other tag)."""
    return tag.group("p_name").strip() if tag.lastgroup == "p_open" else ""


def _is_next(tag: re.Match[str], known: set[str] | None, given: set[str]) -> bool:
    """Whether ``tag`` opens the next parameter of a call: one of the tool's (any name when they are
    unknown) not given yet."""
    name = _parameter_name(tag)
    return bool(name) and name not in given and (known is None or name in known)


def _is_call_header(tag: re.Match[str]) -> bool:
    return tag.lastgroup == "fn_open" and _NAME.fullmatch(tag.group("fn_name")) is not None


class _Scanner:
    def __init__(self, text: str, parameters: Mapping[str, Mapping[str, Any] | None]) -> None:
        self.text = text
        self.tags = _Tokens(text)
        self.parameters = parameters
        self._known_by_tool: dict[str, set[str] | None] = {}
        # What no text added after this one can change (scan_progress): a decision is final until
        # the scanner is first told there are no more tags.
        self.settled = 0
        self.open_call: OpenCall | None = None

    def scan(self) -> list[Item]:
        text, plain_from = self.text, 0
        items: list[Item] = []
        while (tag := self.tags.take()) is not None:
            found: tuple[int, Item, int] | None
            if tag.lastgroup == "tc_open":
                found = self._wrapped(tag)
            elif _is_call_header(tag) and self._starts_bare_call(tag):
                found = self._call(tag.start(), tag, wrapped=False)
            else:
                continue  # plain text, stray tags included
            if found is None:
                continue
            start, item, end = found
            if start > plain_from:
                items.append(text[plain_from:start])
            items.append(item)
            plain_from = end
            if not self.tags.exhausted:
                self.settled, self.open_call = len(items), None
        if plain_from < len(text):
            items.append(text[plain_from:])
        return items

    # -- helpers ------------------------------------------------------------------------------------

    def _blank(self, start: int, end: int) -> bool:
        return _BLANK.fullmatch(self.text, start, end) is not None

    def _next_after_blank(self, pos: int) -> re.Match[str] | None:
        """The next tag when only whitespace separates it from ``pos``, else None (not taken)."""
        tag = self.tags.peek()
        return tag if tag is not None and self._blank(pos, tag.start()) else None

    def _after_close(self, end: int) -> tuple[int, bool]:
        """Where a call closed at ``end`` (just after ``</function>``) ends: after a ``</tool_call>``
        that follows with only whitespace between (taken), else at ``end``; and whether there was one."""
        tag = self._next_after_blank(end)
        if tag is not None and tag.lastgroup == "tc_close":
            self.tags.take()
            return tag.end(), True
        return end, False

    def _may_follow_a_call(self, end: int, full_close: bool) -> bool:
        """Whether the text after ``end`` can follow a call: no more tags, or the next call (after
        only whitespace, unless the call closed with the full close sequence)."""
        tag = self.tags.peek()
        if tag is None:
            return True
        return tag.lastgroup in _OPENERS and (full_close or self._blank(end, tag.start()))

    def _skip_block(self) -> tuple[int, bool, bool]:
        """Take tags up to the next ``</tool_call>``: the block's end (the text's end without one),
        and whether a ``<function=`` and a ``</function>`` came before it."""
        saw_function = saw_close = False
        while (tag := self.tags.take()) is not None:
            if tag.lastgroup == "tc_close":
                return tag.end(), saw_function, saw_close
            saw_function |= tag.lastgroup in ("fn_open", "fn_bad")
            saw_close |= tag.lastgroup == "fn_close"
        return len(self.text), saw_function, saw_close

    def _known(self, name: str) -> set[str] | None:
        """The tool's parameter names; None when the tool or its properties are unknown."""
        if name not in self._known_by_tool:
            schema = self.parameters.get(name)
            properties = schema.get("properties") if isinstance(schema, Mapping) else None
            self._known_by_tool[name] = set(properties) if isinstance(properties, Mapping) else None
        return self._known_by_tool[name]

    # -- blocks -------------------------------------------------------------------------------------

    def _wrapped(self, opener: re.Match[str]) -> tuple[int, Item, int]:
        start = opener.start()
        header = self._next_after_blank(opener.end())
        if header is not None and header.lastgroup in ("fn_open", "fn_bad"):
            self.tags.take()
            if _is_call_header(header):
                found = self._call(start, header, wrapped=True)
                assert found is not None  # a wrapped call is a call or a broken block
                return found
            end = self._skip_block()[0]
            shown = self.text[header.start() : header.start() + 60].split("\n")[0]
            problem = f"the function header `{shown}` is not <function=NAME>"
            return start, BrokenBlock(self.text[start:end], problem), end
        end, saw_function, _ = self._skip_block()
        block = self.text[start:end]
        if saw_function:
            return start, BrokenBlock(block, "unexpected text between <tool_call> and <function=NAME>"), end
        # prose about the format, or a call in another format (JSON): kept in the content
        return start, BrokenBlock(block, "a <tool_call> block without <function=NAME> inside", True), end

    def _starts_bare_call(self, header: re.Match[str]) -> bool:
        """A ``<function=NAME>`` without ``<tool_call>`` is a call only when a parameter or its
        ``</function>`` follows it; otherwise it is text about the format."""
        tag = self._next_after_blank(header.end())
        return tag is not None and (tag.lastgroup == "fn_close" or bool(_parameter_name(tag)))

    def _call(self, start: int, header: re.Match[str], wrapped: bool) -> tuple[int, Item, int] | None:
        """The call whose ``<function=NAME>`` is ``header`` (taken), from ``start`` to its end; a bare
        call that is never closed is text (None)."""
        text, name = self.text, header.group("fn_name")
        first = self._next_after_blank(header.end())
        if first is not None and first.lastgroup == "fn_close":
            self.tags.take()
            end = self._after_close(first.end())[0]
            return start, ScannedCall(name, (), text[start:end]), end
        if first is None or not _parameter_name(first):
            end, _, closed = self._skip_block()
            problem = (
                f"inside <function={name}> there must be only <parameter=NAME>VALUE</parameter> blocks"
                if closed
                else f"<function={name}> is not closed with </function>"
            )
            return start, BrokenBlock(text[start:end], problem), end
        known = self._known(name)
        arguments: list[tuple[str, str]] = []
        opener: re.Match[str] | None = self.tags.take()
        if wrapped and not self.tags.exhausted:
            self.open_call = OpenCall(start, name, ())
        while opener is not None:
            parameter = _parameter_name(opener)
            given = {n for n, _ in arguments} | {parameter}
            ended = self._value(opener.end(), known, given)
            if ended.value_end is not None:
                arguments.append((parameter, self._framed(opener.end(), ended.value_end)))
            if wrapped and ended.next_parameter is not None and not self.tags.exhausted:
                self.open_call = OpenCall(start, name, tuple(arguments))
            if ended.call_end is not None:
                end = ended.call_end
                return start, ScannedCall(name, tuple(arguments), text[start:end]), end
            opener = ended.next_parameter
        if not wrapped:
            return None
        problem = f"<function={name}> is not closed with </function>"
        return start, BrokenBlock(text[start:], problem), len(text)

    def _framed(self, start: int, end: int) -> str:
        """A value without the one newline the format puts after ``<parameter=...>`` and the one
        before the close; any other whitespace belongs to the value."""
        if start < end and self.text[start] == "\n":
            start += 1
        if start < end and self.text[end - 1] == "\n":
            end -= 1
        return self.text[start:end]

    def _value(self, value_start: int, known: set[str] | None, given: set[str]) -> _ValueEnd:
        """Read one value from ``value_start`` (see the module docstring for the rules)."""
        text, tags = self.text, self.tags
        quoted = 0  # quoted calls open in the value
        last_close: tuple[int, int] | None = None  # (value end, call end) of the last close passed over
        while (tag := tags.take()) is not None:
            kind = tag.lastgroup
            if kind == "fn_open":
                quoted += _is_call_header(tag)
                continue
            if kind == "p_open":
                at_line_start = tag.start() == value_start or text[tag.start() - 1] == "\n"
                if not quoted and at_line_start and _is_next(tag, known, given):
                    return _ValueEnd(tag.start(), next_parameter=tag)
                continue
            if kind == "p_close":
                following = self._next_after_blank(tag.end())
                if following is None:
                    if not quoted and tags.peek() is None and self._blank(tag.end(), len(text)):
                        return _ValueEnd(tag.start())  # `</parameter>` and nothing after: cut off
                    continue
                if not quoted and _is_next(following, known, given):
                    tags.take()
                    return _ValueEnd(tag.start(), next_parameter=following)
                if following.lastgroup != "fn_close":
                    continue
                tags.take()
                value_end, close_end, closed_value = tag.start(), following.end(), True
            elif kind == "fn_close":
                value_end, close_end, closed_value = tag.start(), tag.end(), False  # no `</parameter>`
            else:
                continue
            call_end, wrapped_up = self._after_close(close_end)
            if not quoted and self._may_follow_a_call(call_end, full_close=closed_value and wrapped_up):
                return _ValueEnd(value_end, call_end=call_end)
            last_close = (value_end, call_end)
            quoted = max(quoted - 1, 0)
        if last_close is None:
            return _ValueEnd(None)
        tags.restart(last_close[1])
        return _ValueEnd(last_close[0], call_end=last_close[1])
