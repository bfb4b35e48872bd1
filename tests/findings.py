"""What the repository's own checkers (tolerance policy, module docstrings) report: a place and a problem."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Finding:
    """A problem at ``line`` of ``path`` (relative to the repository's root)."""

    path: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"
