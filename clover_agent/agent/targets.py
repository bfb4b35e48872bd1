"""Turning the ``fix`` command's TARGET into tests to run.

TARGET is tried as, in order: a test node id (``tests/test_x.py::test_y``), a test file or folder
of the repository, a ``-k`` keyword expression (``test_add``, ``add and not big``), and finally free
text, matched against the names of the tests the suite has ("addition is wrong" finds
``test_add``). The result is a target string the ``run_tests`` tool understands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clover_agent.errors import UsageError
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in

_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "does",
        "fail",
        "fails",
        "failing",
        "fix",
        "for",
        "from",
        "in",
        "is",
        "it",
        "its",
        "not",
        "of",
        "on",
        "or",
        "should",
        "test",
        "tests",
        "the",
        "this",
        "to",
        "when",
        "with",
        "wrong",
        "broken",
        "bug",
    ]
)


@dataclass
class TestSelection:
    """What to run: ``target`` for ``run_tests``; ``how`` says how TARGET was understood."""

    __test__ = False  # not a pytest test class

    target: str
    how: str  # "node id" | "file" | "keyword" | "free text"
    report: TestReport  # the selection run once, as it is now


async def select_tests(
    sandbox: Sandbox, text: str, repo: Path, suite: TestReport | None = None
) -> TestSelection:
    """Resolve ``text`` (the user's TARGET) to tests and run them once.

    ``suite`` is a run of the whole suite, needed only for free text; it is made when missing.
    Raises :class:`UsageError` when nothing matches.
    """
    text = text.strip()
    if not text:
        raise UsageError("the TARGET is empty: give a test node id, a test file, a keyword or a description")
    candidates: list[tuple[str, str]] = []
    if "::" in text:
        candidates.append((text, "node id"))
    elif (repo / text).exists() and not text.startswith("/"):
        candidates.append((text, "file"))
    elif text.startswith("-k "):
        candidates.append((text, "keyword"))
    elif _looks_like_keyword(text):
        candidates.append((f"-k {text}", "keyword"))
    for target, how in candidates:
        report = await run_tests_in(sandbox, target)
        if report.total > 0:
            return TestSelection(target, how, report)
        if how != "keyword":
            raise UsageError(f"{text!r} selects no tests ({how}): {report.problem or report.summary()}")
    suite = suite or await run_tests_in(sandbox, None)
    names = match_test_names(text, list(suite.outcomes))
    if not names:
        raise UsageError(
            f"no test matches {text!r}: not a node id, file or -k keyword, and no test name shares a word "
            f"with it ({len(suite.outcomes)} tests looked at). Give a test node id such as "
            "tests/test_x.py::test_y."
        )
    target = "-k " + " or ".join(names)
    return TestSelection(target, "free text", await run_tests_in(sandbox, target))


def _looks_like_keyword(text: str) -> bool:
    """A pytest ``-k`` expression: names joined by and / or / not, maybe in parentheses."""
    words = [w for w in re.split(r"[\s()]+", text) if w]
    names = [w for w in words if w not in ("and", "or", "not")]
    return (
        bool(names)
        and all(re.fullmatch(r"[\w.\[\]-]+", w) for w in words)
        and (len(names) == 1 or len(names) < len(words))
    )


def match_test_names(text: str, test_ids: list[str], limit: int = 5) -> list[str]:
    """Test function names sharing the most words with ``text`` (prefixes count: "addition" ~ "add")."""
    words = {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS and len(w) > 1}
    scored: dict[str, int] = {}
    for test_id in test_ids:
        name = re.sub(r"\[.*\]$", "", test_id.split("::")[-1])
        tokens = {t for t in re.findall(r"[a-z0-9]+", test_id.lower()) if t not in ("test", "tests", "py")}
        score = sum(1 for w in words if any(_related(w, t) for t in tokens))
        if score:
            scored[name] = max(score, scored.get(name, 0))
    if not scored:
        return []
    best = max(scored.values())
    return sorted(name for name, score in scored.items() if score == best)[:limit]


def _related(word: str, token: str) -> bool:
    if word == token:
        return True
    shorter, longer = sorted((word, token), key=len)
    return len(shorter) >= 3 and longer.startswith(shorter)
