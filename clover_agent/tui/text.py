"""Text from the model, the tools or the repository made safe to draw; and the person's ``@path``
mentions made sandbox paths.

A terminal acts on control characters: an escape sequence in a tool's output (``\\x1b[2J``) would
clear the screen, move the cursor or change colours under the app. :func:`printable` shows them as
visible escapes (:func:`clover_agent.safe_text.terminal_safe`, the one rule every front end uses).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, TypeVar

from clover_agent.events import Event
from clover_agent.safe_text import terminal_safe
from clover_agent.sandboxes.base import WORKSPACE

EventT = TypeVar("EventT", bound=Event)

_MENTION = re.compile(r"(?<![\w/])@([\w./-]+)")


def printable(text: str, *, single_line: bool = False) -> str:
    """:func:`terminal_safe` for the app's screen: never a log, and model text arrives in pieces
    of lines, so workflow commands are left as they are."""
    return terminal_safe(text, single_line=single_line, workflow_commands=False)


def _printable_value(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_value(v) for v in value]
    if isinstance(value, dict):
        return {_printable_value(k): _printable_value(v) for k, v in value.items()}
    return value


def printable_event(event: EventT) -> EventT:
    """A copy of ``event`` whose texts (nested in lists and dicts too) are :func:`printable`."""
    changes = {
        f.name: _printable_value(getattr(event, f.name))
        for f in dataclasses.fields(event)
        if isinstance(getattr(event, f.name), str | list | dict)
    }
    return dataclasses.replace(event, **changes)


def sandbox_paths(repo: Path, text: str) -> str:
    """``@path`` of a file in ``repo`` becomes its path in the sandbox (others stay as typed)."""

    def replace(match: re.Match[str]) -> str:
        path = match.group(1).rstrip(".")
        tail = match.group(1)[len(path) :]
        if (repo / path).exists() and ".." not in path.split("/"):
            return f"{WORKSPACE}/{path}{tail}"
        return match.group(0)

    return _MENTION.sub(replace, text)
