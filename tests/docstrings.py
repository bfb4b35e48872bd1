"""What a module docstring of the package may hold, and a checker that finds each one that holds more.

A module docstring says what the module is and why it exists, in at most :data:`MAX_LINES` lines;
the long story lives in docs/ (or in the docstring of the function or class it describes), and
figures live in bench/RESULTS.md with where they were measured. So a module docstring holds no
measurement (:data:`MEASUREMENT`): no number with a unit of time, speed or size, no "3x faster". A
limit the code enforces is named by its constant (``MAX_FILE_BYTES``), never restated as a figure
that drifts from it. The checker reads the syntax tree (``ast``); nothing is imported or run.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterable
from pathlib import Path

from tests.findings import Finding
from tests.import_layers import SIBLINGS

ROOT = Path(__file__).resolve().parents[1]
#: The package's folders whose modules are checked (tests, examples, bench and scripts are not).
FOLDERS = ("clover_agent", *SIBLINGS)
#: The most lines a module docstring may have (leading and trailing blank lines not counted).
MAX_LINES = 12
_UNIT = (
    r"(?:[mµun]s|s|secs?|seconds?|mins?|minutes?|h|hours?"  # time
    r"|tok/s|tokens?/s|it/s|ops/s|req/s"  # speed
    r"|[KMGTP]i?B|kB|bytes)"  # size
)
#: A measurement: a number (``~35``, ``2,000``, ``4.2``) and a unit of time, speed or size
#: (``ms``, ``s``, ``min``, ``tok/s``, ``GB``, ``GiB``, ``MiB``, ``bytes``), or a ratio said to be
#: faster or slower (``3x faster``, ``40% slower``). What has no such unit is not one: a version
#: (``3.11``), a count (``32-token blocks``, ``248,320 rows``, ``400 lines``), an exit code, a mode
#: (``0600``), a shape (``2 x block_size``), a model's name (``35B-A3B``).
MEASUREMENT = re.compile(
    r"(?<![\w.])~?\d+(?:[.,]\d+)*\s?" + _UNIT + r"(?![\w/])"
    r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:x|×|%|times)\s+(?:faster|slower|quicker|speed-?ups?)\b"
)


def module_docstring(source: str) -> tuple[int, str] | None:
    """The line a module's docstring starts on and its text as written, or None when it has none."""
    body = ast.parse(source).body
    first = body[0] if body and isinstance(body[0], ast.Expr) else None
    if first is None or not isinstance(first.value, ast.Constant) or not isinstance(first.value.value, str):
        return None
    return first.lineno, first.value.value


def check(path: str, source: str) -> list[Finding]:
    """What breaks the rule in one module's docstring: its length, and each measurement it holds."""
    found = module_docstring(source)
    if found is None:
        return []
    start, text = found
    problems = []
    lines = len(inspect.cleandoc(text).splitlines())
    if lines > MAX_LINES:
        problems.append(Finding(path, start, f"module docstring of {lines} lines (at most {MAX_LINES})"))
    for offset, line in enumerate(text.splitlines()):
        for match in MEASUREMENT.finditer(line):
            problems.append(
                Finding(path, start + offset, f"a measurement in the module docstring: {match.group()!r}")
            )
    return problems


def findings(root: Path = ROOT, folders: Iterable[str] = FOLDERS) -> list[Finding]:
    """Every module docstring under ``folders`` of ``root`` that breaks the rule, in path order."""
    found: list[Finding] = []
    for folder in folders:
        for file in sorted((root / folder).rglob("*.py")):
            found += check(file.relative_to(root).as_posix(), file.read_text(encoding="utf-8"))
    return sorted(found)
