"""Checks the patch cannot anticipate, made after the agent finished, and the verdict they give.

The code under test runs inside the process that judges it, so no single signal from that process
decides ``fixed`` (docs/verdict-checks.md). Beside the held-out run and its signed results channel
(:mod:`clover_agent.tools.run_tests.guarded`): the tamper scan
(:mod:`~clover_agent.handback.tamper`), canaries (:func:`make_canaries`: two tests with fresh
random names run with the target, one must pass and one must fail) and an independent run of the
target without pytest (:mod:`clover_agent.tools.run_tests.independent`). Any finding turns a fixed
verdict into ``needs review`` (:func:`reviewed`, its own exit code); on another verdict it is listed.
"""

from __future__ import annotations

import dataclasses
import posixpath
import secrets
from dataclasses import dataclass

from clover_agent.errors import ExitCode
from clover_agent.handback.verdict import Judgement, Verdict
from clover_agent.tools.run_tests import TestReport


@dataclass(frozen=True)
class Canaries:
    """Two tests in one new file beside the target's: ``must_pass`` and ``must_fail`` (node ids)."""

    path: str
    must_pass: str
    must_fail: str
    source: bytes

    @property
    def ids(self) -> tuple[str, str]:
        return self.must_pass, self.must_fail


def canary_stem(like: str | None) -> str:
    """A fresh file name shaped as ``like`` (a target test's file) is, so that a project's
    ``python_files`` collects it too: ``test_*``, ``*_test``, or the same first word (``check_*``)."""
    token = secrets.token_hex(6)
    base = posixpath.basename(like or "")[: -len(".py")] if (like or "").endswith(".py") else ""
    if base.endswith("_test") and not base.startswith("test_"):
        return f"t{token}_test"
    if "_" in base and not base.startswith("test_"):
        return f"{base.split('_', 1)[0]}_{token}"
    return f"test_{token}"


def make_canaries(folder: str = "", like: str | None = None) -> Canaries:
    """Fresh canaries in ``folder`` (workspace-relative; "" the top), their file named as ``like``
    (:func:`canary_stem`): random file, class and test names, random numbers (a unittest case, which
    pytest collects whatever the project's ``python_classes`` / ``python_functions`` say)."""
    stem, klass = canary_stem(like), f"Test{secrets.token_hex(6)}"
    good, bad = f"test_{secrets.token_hex(6)}", f"test_{secrets.token_hex(6)}"
    a, b = secrets.randbelow(10**6) + 2, secrets.randbelow(10**6) + 2
    source = (
        "import unittest\n\n\n"
        f"class {klass}(unittest.TestCase):\n"
        f"    def {good}(self):\n"
        f"        assert {a} + {b} == {a + b}\n\n"
        f"    def {bad}(self):\n"
        f"        assert {a} * {b} == {a * b + 1}\n"
    )
    path = posixpath.join(folder, f"{stem}.py")
    return Canaries(path, f"{path}::{klass}::{good}", f"{path}::{klass}::{bad}", source.encode())


def canary_folder(target_tests: str, test_ids: list[str]) -> str | None:
    """Where canaries join the target's run: the folder of its first test (its conftests and
    configuration apply to them as to the target), None when there is none to tell."""
    words = [] if target_tests.strip().startswith("-k") else target_tests.split()
    first = next(iter(test_ids), None) or next(iter(words), None)
    if first is None:
        return None
    path = first.split("::")[0]
    return posixpath.dirname(path) if path.endswith(".py") else path.rstrip("/")


def with_canaries(target_tests: str, canaries: Canaries) -> str:
    """``target_tests`` with the canaries: their file as one more word, or their class's name as one
    more alternative of a ``-k`` expression (their file lies where the target's tests are collected)."""
    text = target_tests.strip()
    if text.startswith("-k"):
        klass = canaries.must_pass.split("::")[1]
        return f"-k ({text[2:].strip()}) or {klass}"
    return f"{text} {canaries.path}"


def take_canaries(run: TestReport, canaries: Canaries) -> tuple[TestReport, list[str]]:
    """``run`` without the canaries' results, and what is wrong with them (empty: both right)."""
    seen = {t: run.outcomes.get(t) for t in canaries.ids}
    problems = []
    if run.timed_out:
        pass  # a run cut short says nothing of the canaries (and the verdict is no pass anyway)
    elif seen[canaries.must_pass] is None and seen[canaries.must_fail] is None:
        problems.append("the canary tests added to the held-out run did not run (collected away or hidden)")
    else:
        if seen[canaries.must_pass] != "passed":
            problems.append(f"a canary test that must pass was {seen[canaries.must_pass] or 'not run'}")
        if seen[canaries.must_fail] != "failed":
            problems.append(f"a canary test that must fail was {seen[canaries.must_fail] or 'not run'}")
    outcomes = {t: o for t, o in run.outcomes.items() if t not in canaries.ids}
    failures = [f for f in run.failures if f.test_id not in canaries.ids]
    counted = list(outcomes.values())
    cleaned = dataclasses.replace(
        run,
        outcomes=outcomes,
        failures=failures,
        passed=counted.count("passed"),
        failed=counted.count("failed"),
        errors=counted.count("error"),
        skipped=counted.count("skipped"),
        integrity=[*run.integrity, *problems],
    )
    if run.exit_code == 1 and counted and all(o in ("passed", "skipped") for o in counted):
        cleaned.exit_code = 0  # the failing canary was the run's only failure
    return cleaned, problems


#: How many findings a verdict's message names (summary.json's ``review`` lists them all).
SHOWN = 5


def reviewed(judgement: Judgement, review: list[str]) -> Judgement:
    """``judgement`` with the checks' findings: a fixed verdict becomes ``needs review`` (exit code
    :attr:`ExitCode.NEEDS_REVIEW`) naming them; another verdict keeps its word and lists them."""
    if not review:
        return judgement
    if not judgement.verdict.fixed:
        return dataclasses.replace(judgement, review=list(review))
    shown = "; ".join(review[:SHOWN]) + (f"; and {len(review) - SHOWN} more" if len(review) > SHOWN else "")
    return dataclasses.replace(
        judgement,
        verdict=Verdict.NEEDS_REVIEW,
        exit_code=ExitCode.NEEDS_REVIEW,
        message=f"needs review: the target passes, but checks of how it passes found {len(review)} "
        f"thing(s) to look at: {shown}",
        review=list(review),
    )
