"""What ``/apply`` tells the person, and what an undo put back.

The hand-back itself is the one every front end uses (:mod:`clover_agent.handback.session`): the
changes read on the host, judged held out as ``fix`` judges them, a part chosen file by file judged
again on its own, and the verified bytes written all or nothing. This module holds what the TUI
adds: the outcome of one apply as the session reports it, and the files an ``/undo`` changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clover_agent.handback.session import FileChange, sections

__all__ = ["ApplyOutcome", "FileChange", "files_differing"]


@dataclass
class ApplyOutcome:
    """What one ``/apply`` did: the files written, those refused (path -> why) and the verdict on
    exactly the bytes written (``<verdict>: <message>``)."""

    applied: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    verdict: str = ""


def files_differing(before: str, after: str) -> list[str]:
    """The files whose part of two workspace diffs differs (what an undo put back)."""
    old, new = sections(before), sections(after)
    return sorted(path for path in old.keys() | new.keys() if old.get(path) != new.get(path))
