"""The ``[[hooks.EVENT]]`` tables of the user's settings (and of a trusted repository's
``.clover/config.toml``), read into :class:`HookConfig` entries.

Both Claude Code's nested form (``matcher`` with a list of ``hooks``, each ``type = "command"``)
and a flat form (``matcher``, ``command``, ``timeout`` in one table) are read, so a ported
configuration needs no reshaping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The events a hook can be bound to: Claude Code's names, and ours for the hand-back.
EVENTS = (
    "PreToolUse",
    "PostToolUse",
    "UserPromptSubmit",
    "Stop",
    "SessionStart",
    "SessionEnd",
    "PreHandBack",
)
#: Events whose hooks choose calls by their tool's name (``matcher``).
TOOL_EVENTS = ("PreToolUse", "PostToolUse")
#: Events whose ``matcher`` is tried on a word, as Claude Code's: SessionStart's source (startup,
#: resume), SessionEnd's reason.
WORD_EVENTS = ("SessionStart", "SessionEnd")
#: Seconds a hook may run unless its table says otherwise.
DEFAULT_TIMEOUT_S = 60.0
WHERE = ("host", "sandbox")
_FLAT_KEYS = {"matcher", "command", "timeout", "where", "type"}
_NESTED_KEYS = {"matcher", "hooks"}
_COMMAND_KEYS = {"type", "command", "timeout", "where"}


@dataclass(frozen=True)
class HookConfig:
    """One hook: the shell ``command`` run on ``event`` for the tools ``matcher`` matches (a
    regular expression matched whole against the tool's names, or SessionStart's source and
    SessionEnd's reason; None: every one), at most
    ``timeout_s`` seconds, on the host or in the sandbox (``where``). ``origin`` says whose file
    named it (settings or repository), for the messages."""

    event: str
    command: str
    matcher: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    where: str = "host"
    origin: str = "settings"

    def matches(self, names: tuple[str, ...]) -> bool:
        """Whether this hook applies to a call of the tool known by ``names`` (ours, then Claude
        Code's aliases). No matcher, ``""`` or ``*``: every tool."""
        if self.matcher in (None, "", "*"):
            return True
        pattern = re.compile(self.matcher)
        return any(pattern.fullmatch(name) for name in names)

    def describe(self) -> str:
        """The hook as its messages name it: the event, the command and where it runs."""
        where = "" if self.where == "host" else f", in the {self.where}"
        return f"{self.event} hook `{self.command}` ({self.origin}{where})"


def parse_hooks(tables: Mapping[str, Any], *, origin: str) -> tuple[HookConfig, ...]:
    """The hooks of a ``[hooks]`` table (event name to a list of tables). Raises
    :class:`ValueError` naming the event, the entry and what is wrong."""
    found: list[HookConfig] = []
    for event, entries in tables.items():
        if event not in EVENTS:
            raise ValueError(f"[hooks] {event!r} is not an event (known: {', '.join(EVENTS)})")
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
            raise ValueError(f"[hooks] {event} must be a list of tables ([[hooks.{event}]])")
        for index, entry in enumerate(entries):
            found += _entry(event, index, entry, origin)
    return tuple(found)


def _entry(event: str, index: int, entry: Mapping[str, Any], origin: str) -> list[HookConfig]:
    where = f"[[hooks.{event}]] #{index + 1}"
    nested = "hooks" in entry
    unknown = sorted(set(entry) - (_NESTED_KEYS if nested else _FLAT_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    matcher = entry.get("matcher")
    if matcher is not None:
        if not isinstance(matcher, str):
            raise ValueError(f"{where}: matcher must be a string (a regular expression on tool names)")
        if event not in TOOL_EVENTS + WORD_EVENTS and matcher not in ("", "*"):
            raise ValueError(f"{where}: matcher applies only to {', '.join(TOOL_EVENTS + WORD_EVENTS)}")
        try:
            re.compile(matcher)
        except re.error as exc:
            raise ValueError(f"{where}: matcher {matcher!r} is not a regular expression ({exc})") from None
    commands = entry["hooks"] if nested else [{k: v for k, v in entry.items() if k != "matcher"}]
    if not isinstance(commands, list) or not commands:
        raise ValueError(f"{where}: hooks must be a non-empty list of tables")
    return [_command(event, f"{where} hook #{i + 1}" if nested else where, c, matcher, origin)
            for i, c in enumerate(commands)]  # fmt: skip


def _command(event: str, where: str, table: Any, matcher: str | None, origin: str) -> HookConfig:
    if not isinstance(table, Mapping):
        raise ValueError(f"{where} must be a table")
    unknown = sorted(set(table) - _COMMAND_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if table.get("type", "command") != "command":
        raise ValueError(f'{where}: type must be "command" (the only kind of hook here)')
    command = table.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"{where}: command must be a non-empty string")
    timeout = table.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{where}: timeout must be a number of seconds above 0")
    place = table.get("where", "host")
    if place not in WHERE:
        raise ValueError(f'{where}: where must be "host" or "sandbox"')
    if place == "sandbox" and event == "PreHandBack":
        raise ValueError(f"{where}: a PreHandBack hook runs on the host (the hand-back is to your tree)")
    return HookConfig(event, command, matcher, float(timeout), place, origin)
