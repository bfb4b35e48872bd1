"""Turning the ``fix`` command's TARGET into tests to run.

TARGET is tried as, in order: a test node id (``tests/test_x.py::test_y``), a test file or folder
of the repository, a ``-k`` keyword expression (``test_add``, ``add and not big``), and finally free
text, matched against the ids of the tests the suite has ("addition is wrong" finds
``tests/test_calc.py::test_add``). The result is a target string the ``run_tests`` tool understands.
Free text that names no test but a failure ("the failing test", "fix the bug": :func:`means_failing_now`)
stands for the tests failing now, as no TARGET does.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from clover_agent.errors import UsageError
from clover_agent.handback.diagnosis import diagnose
from clover_agent.handback.hostgit import git as host_git
from clover_agent.handback.judging import target_for
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, run_tests_in

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


#: The words of a TARGET that names no test, only "the tests that fail now" (:func:`means_failing_now`);
#: one of them must say that something fails ("the test" alone names nothing).
_FAILURE_WORDS = frozenset(
    {
        "fail",
        "failed",
        "failing",
        "fails",
        "failure",
        "failures",
        "fix",
        "broken",
        "bug",
        "bugs",
        "red",
        "repair",
    }
)
_FAILING_NOW_WORDS = _FAILURE_WORDS | {
    "a", "all", "an", "any", "are", "currently", "every", "is", "it", "make", "my", "now", "one", "ones",
    "our", "pass", "test", "tests", "the", "them", "these", "this", "those", "case", "cases",
}  # fmt: skip


def means_failing_now(text: str, repo: Path) -> bool:
    """``text`` (a TARGET) is a phrase such as "the failing test", "failing tests", "fix the bug" or
    "make the failing tests pass": two or more words, all of them generic ones, one of them naming
    a failure. Never a node id, a ``-k`` expression or a path of ``repo``, whatever words they hold."""
    words = text.strip().lower().rstrip(".!").split()
    return (
        len(words) >= 2
        and all(word in _FAILING_NOW_WORDS for word in words)
        and any(word in _FAILURE_WORDS for word in words)
        and not _names_a_path(repo, text.strip())  # a file or folder of that name is the file
    )


def _names_a_path(repo: Path, text: str) -> bool:
    """Whether ``text`` is the relative path of something in ``repo``; text no path can be (longer
    than a file name may be, a NUL byte) is not one."""
    if text.startswith("/"):
        return False
    try:
        return (repo / text).exists()
    except (OSError, ValueError):
        return False


@dataclass
class TestSelection:
    """What to run: ``target`` for ``run_tests``; ``how`` says how TARGET was understood."""

    __test__ = False  # not a pytest test class

    target: str
    how: str  # "node id" | "file" | "keyword" | "free text"
    report: TestReport  # the selection run once, as it is now
    suite: TestReport | None = None  # the whole suite's run, when free text needed one


async def select_tests(
    sandbox: Sandbox,
    text: str,
    repo: Path,
    suite: TestReport | None = None,
    *,
    workers: int = 1,
    suite_timeout: float = DEFAULT_TIMEOUT_S,
    test_timeout: float | None = None,
) -> TestSelection:
    """Resolve ``text`` (the user's TARGET) to tests and run them once.

    - ``suite``: a run of the whole suite, needed only for free text; made when missing, and kept in
      the selection.
    - ``workers``, ``suite_timeout``: that suite run's processes (where the project has pytest-xdist)
      and its limit in seconds.
    - ``test_timeout``: each test's own limit (None: a fifth of the run's).

    Free text prefers the tests that fail now. A run that could not start at all (pytest refusing its
    configuration, not installed) is returned as it is, for the caller to name the cause. Raises
    :class:`UsageError` when nothing matches.
    """
    text = text.strip()
    if not text:
        raise UsageError("the TARGET is empty: give a test node id, a test file, a keyword or a description")
    candidates: list[tuple[str, str]] = []
    if "::" in text:
        candidates.append((text, "node id"))
    elif _names_a_path(repo, text):
        candidates.append((text, "file"))
    elif " " not in text and not text.startswith("/") and ("/" in text or text.endswith(".py")):
        raise UsageError(
            f"TARGET {text!r} looks like a file, but {repo} has no such file{_closest_files(text, repo)}"
        )
    elif text.startswith("-k "):
        candidates.append((text, "keyword"))
    elif _looks_like_keyword(text):
        candidates.append((f"-k {text}", "keyword"))
    for target, how in candidates:
        report = await run_tests_in(sandbox, target, test_timeout=test_timeout)
        if report.total > 0 or (report.problem and diagnose(report, set()) is not None):
            return TestSelection(target, how, report)  # tests, or the environment's fault named
        if how != "keyword":
            raise UsageError(f"{text!r} selects no tests ({how}): {report.problem or report.summary()}")
    suite = suite or await run_tests_in(
        sandbox, None, timeout=suite_timeout, workers=workers, test_timeout=test_timeout
    )
    if not suite.outcomes:  # nothing to match against: say so rather than "no test matches"
        if suite.framework == "none":
            why = "no pytest or unittest files, package.json test script, go.mod or Cargo.toml"
        else:
            why = suite.problem or suite.summary()
        raise UsageError(f"found no tests in {repo} ({why}); fix works from a failing test")
    # Tests that fail now first: the user describes a failure, not a passing test.
    failing = [t for t, outcome in suite.outcomes.items() if outcome in ("failed", "error")]
    matches = match_tests(text, failing) or match_tests(text, list(suite.outcomes))
    if not matches:
        closest = closest_tests(text, list(suite.outcomes))
        example = closest[0] if closest else "tests/test_x.py::test_y"
        near = f"; the closest: {', '.join(closest)}" if closest else ""
        raise UsageError(
            f"no test matches {text!r}: not a node id, file or -k keyword, and no test name shares a word "
            f"with it ({len(suite.outcomes)} tests looked at{near}). Give a test node id such as {example}."
        )
    target = target_for(matches)
    return TestSelection(
        target, "free text", await run_tests_in(sandbox, target, test_timeout=test_timeout), suite
    )


def closest_tests(text: str, test_ids: list[str], limit: int = 3) -> list[str]:
    """The test ids whose names are nearest to ``text`` as spelt (a typo: "test_sbutract" ->
    ``...::test_subtract``), best first; none when nothing is close."""
    names: dict[str, str] = {}
    for test_id in test_ids:
        names.setdefault(re.sub(r"\[.*\]$", "", test_id.split("::")[-1]), test_id)
    wanted = text.split("::")[-1].removeprefix("-k ").strip()
    return [names[name] for name in difflib.get_close_matches(wanted, list(names), n=limit, cutoff=0.6)]


def _closest_files(text: str, repo: Path) -> str:
    """ ", did you mean ...?" naming the repository's files nearest to ``text``, or ""."""
    # The host's safe git: the repository's hooks, fsmonitor or filters run nothing here.
    out = host_git(repo, "ls-files", "-z", "-co", "--exclude-standard", check=False).stdout
    listed = [name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]
    close = difflib.get_close_matches(text, listed, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _looks_like_keyword(text: str) -> bool:
    """A pytest ``-k`` expression: names joined by and / or / not, maybe in parentheses."""
    words = [w for w in re.split(r"[\s()]+", text) if w]
    names = [w for w in words if w not in ("and", "or", "not")]
    return (
        bool(names)
        and all(re.fullmatch(r"[\w.\[\]-]+", w) for w in words)
        and (len(names) == 1 or len(names) < len(words))
    )


def match_tests(text: str, test_ids: list[str], limit: int = 5) -> list[str]:
    """The test ids whose names share the most words with ``text`` (prefixes count: "addition"
    matches "add", "division" matches "divide"); at most ``limit`` of them, in suite order."""
    words = {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS and len(w) > 1}
    scores: dict[str, int] = {}
    for test_id in test_ids:
        # Words of the id, CamelCase split: "TestParser::test_reads" -> parser, reads.
        parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", test_id)
        tokens = {p.lower() for p in parts} - {"test", "tests", "py"}
        score = sum(1 for w in words if any(_related(w, t) for t in tokens))
        if score:
            scores[test_id] = score
    if not scores:
        return []
    best = max(scores.values())
    return [t for t, score in scores.items() if score == best][:limit]


def _related(word: str, token: str) -> bool:
    """Same word, one a prefix of the other ("add" ~ "adding"), or a shared stem ("division" ~ "divide")."""
    if word == token:
        return True
    shorter, longer = sorted((word, token), key=len)
    if len(shorter) >= 3 and longer.startswith(shorter):
        return True
    stem = next((i for i, (a, b) in enumerate(zip(word, token, strict=False)) if a != b), len(shorter))
    return stem >= 4
