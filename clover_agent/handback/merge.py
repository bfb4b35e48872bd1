"""The agent's change to a file merged with the edits the user made to it since the run started.

Three-way, by ``git merge-file`` on the host (its settings safe: :mod:`.hostgit`): the file as the
run started (the base), the user's file now, and the agent's. Hunks that do not overlap are all
kept; where the agent's change overlaps the user's edit, the user's side is kept and the agent's
hunk is named as left out, or, when the user asks for it, both are written between conflict
markers. Binary files are never merged.

The markers are longer than any marker-like line in the three versions (``--marker-size``): a
conflict block the agent writes into its own text is text, never taken (or named) as an overlap.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clover_agent.handback.hostgit import git

YOURS, BASE, THEIRS = "yours", "the run's start", "clover-agent"
MARKER_SIZE = 7  # git's
_MARKER_LIKE = re.compile(rb"(?m)^(<+|=+|>+|\|+)")  # ^: after a line feed, as git ends lines


@dataclass(frozen=True)
class Merged:
    """The bytes to write, and each hunk of the agent's that overlapped the user's edit: where it
    is in the written file (``line N``), left out (or written between conflict markers)."""

    data: bytes
    overlaps: tuple[str, ...] = ()
    markers: bool = False


def can_merge(*versions: bytes) -> bool:
    """Text on every side (no NUL byte): what ``git merge-file`` merges line by line."""
    return not any(b"\0" in v for v in versions)


def merge(base: bytes, yours: bytes, theirs: bytes, *, markers: bool = False) -> Merged:
    """Merge the agent's change (``base`` -> ``theirs``) into ``yours``; see the module docstring."""
    with tempfile.TemporaryDirectory(prefix="clover-merge-") as scratch:
        folder = Path(scratch).resolve()
        # no repository around the scratch folder (a TMPDIR inside one) shapes the merge
        alone = {"GIT_CEILING_DIRECTORIES": str(folder.parent)}
        for name, data in (("yours", yours), ("base", base), ("theirs", theirs)):
            (folder / name).write_bytes(data)
        size = marker_size(base, yours, theirs)
        labels = (f"--marker-size={size}", "-L", YOURS, "-L", BASE, "-L", THEIRS)
        marked = git(folder, "merge-file", "-p", *labels, "yours", "base", "theirs", check=False, env=alone)
        if marked.returncode < 0 or marked.returncode > 127:
            raise ValueError(f"git merge-file failed: {marked.stderr.decode(errors='replace').strip()}")
        if marked.returncode == 0:
            return Merged(marked.stdout)
        overlaps = _overlaps(marked.stdout, size, keep_yours=not markers)
        if markers:
            return Merged(marked.stdout, overlaps, markers=True)
        kept = git(
            folder, "merge-file", "-p", "--ours", *labels, "yours", "base", "theirs", check=False, env=alone
        )
        if kept.returncode != 0:
            raise ValueError(f"git merge-file --ours failed: {kept.stderr.decode(errors='replace').strip()}")
        return Merged(kept.stdout, overlaps)


def _lines(data: bytes) -> list[bytes]:
    """``data``'s lines as git counts them (each ended by a line feed alone)."""
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def marker_size(*versions: bytes) -> int:
    """Conflict markers no line of ``versions`` can be mistaken for: longer than every run of
    ``<``, ``=``, ``>`` or ``|`` that starts a line (git's size when there is none that long)."""
    runs = (len(m.group(1)) for v in versions for m in _MARKER_LIKE.finditer(v))
    return max(MARKER_SIZE, max(runs, default=0) + 1)


def _overlaps(marked: bytes, size: int, *, keep_yours: bool) -> tuple[str, ...]:
    """Where each conflict lands in the written file: ``line N`` (N counted in that file: with the
    user's side kept, or with the markers written), with the size of the agent's hunk. ``size``:
    the markers' (no line of the versions merged starts like one)."""
    start_, middle, end = (
        re.compile(b"<" * size + b" "),
        re.compile(b"=" * size + rb"\r?$"),
        re.compile(b">" * size + b" "),
    )
    found, line, side, start, theirs = [], 1, "", 0, 0
    for text in _lines(marked):
        if side == "" and start_.match(text):
            side, start, theirs = "yours", line, 0
            if not keep_yours:
                line += 1
            continue
        if side == "yours" and middle.match(text):
            side = "theirs"
            if not keep_yours:
                line += 1
            continue
        if side == "theirs" and end.match(text):
            found.append(
                f"line {start} ({theirs} line(s) of the agent's left out)" if keep_yours else f"line {start}"
            )
            side = ""
            if not keep_yours:
                line += 1
            continue
        if side == "theirs":
            theirs += 1
            if keep_yours:
                continue
        line += 1
    return tuple(found)
