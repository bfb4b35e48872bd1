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
    """Two tests in one new file beside the target's, written twice: as a unittest case (pytest
    collects it whatever the project's ``python_classes`` / ``python_functions`` say) and as plain
    functions (which a conftest's autouse fixture with ``params`` can parametrize, as it cannot a
    unittest case). ``must_pass`` and ``must_fail`` are the case's node ids, ``plain_pass`` and
    ``plain_fail`` the functions'."""

    path: str
    must_pass: str
    must_fail: str
    source: bytes
    plain_pass: str = ""
    plain_fail: str = ""

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for i in (self.must_pass, self.must_fail, self.plain_pass, self.plain_fail) if i)

    def owns(self, test_id: str) -> bool:
        """Whether ``test_id`` is one of the canaries (a parametrized variant, ``id[...]``, too)."""
        return any(test_id == i or test_id.startswith(i + "[") for i in self.ids)


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
    (:func:`canary_stem`): random file, class and test names, random numbers; the same pair as a
    unittest case and as plain functions (see :class:`Canaries`)."""
    stem, klass = canary_stem(like), f"Test{secrets.token_hex(6)}"
    good, bad = f"test_{secrets.token_hex(6)}", f"test_{secrets.token_hex(6)}"
    a, b = secrets.randbelow(10**6) + 2, secrets.randbelow(10**6) + 2
    source = (
        "import unittest\n\n\n"
        f"class {klass}(unittest.TestCase):\n"
        f"    def {good}(self):\n"
        f"        assert {a} + {b} == {a + b}\n\n"
        f"    def {bad}(self):\n"
        f"        assert {a} * {b} == {a * b + 1}\n\n\n"
        f"def {good}():\n"
        f"    assert {a} + {b} == {a + b}\n\n\n"
        f"def {bad}():\n"
        f"    assert {a} * {b} == {a * b + 1}\n"
    )
    path = posixpath.join(folder, f"{stem}.py")
    return Canaries(
        path,
        f"{path}::{klass}::{good}",
        f"{path}::{klass}::{bad}",
        source.encode(),
        plain_pass=f"{path}::{good}",
        plain_fail=f"{path}::{bad}",
    )


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
        klass, good = canaries.must_pass.split("::")[1:3]
        bad = canaries.must_fail.split("::")[2]
        return f"-k ({text[2:].strip()}) or {klass} or {good} or {bad}"
    return f"{text} {canaries.path}"


def take_canaries(run: TestReport, canaries: Canaries) -> tuple[TestReport, list[str]]:
    """``run`` without the canaries' results, and what is wrong with them (empty: right).

    Right: in one form at least (the unittest case, or the plain functions with every variant a
    parametrizing fixture made), the must-pass test passed and the must-fail one failed. Wrong,
    whatever the other form did: a must-fail canary that passed, or a must-pass one that failed."""

    def seen(test_id: str) -> list[str]:
        return [
            o for t, o in run.outcomes.items() if test_id and (t == test_id or t.startswith(test_id + "["))
        ]

    forms = [(seen(canaries.must_pass), seen(canaries.must_fail))]
    if canaries.plain_pass:
        forms.append((seen(canaries.plain_pass), seen(canaries.plain_fail)))
    problems = []
    if run.timed_out:
        pass  # a run cut short says nothing of the canaries (and the verdict is no pass anyway)
    elif not any(p or f for p, f in forms):
        problems.append("the canary tests added to the held-out run did not run (collected away or hidden)")
    else:
        right = any(
            "passed" in p
            and set(p) <= {"passed", "skipped"}
            and "failed" in f
            and set(f) <= {"failed", "skipped"}
            for p, f in forms
        )
        if any("failed" in p for p, _ in forms):
            problems.append("a canary test that must pass was failed")
        if any("passed" in f for _, f in forms):
            problems.append("a canary test that must fail was passed")
        if not right and not problems:  # errors, or not run: said as the unittest case got it
            p, f = forms[0] if forms[0][0] or forms[0][1] else forms[-1]
            if p != ["passed"]:
                problems.append(f"a canary test that must pass was {p[0] if p else 'not run'}")
            if f != ["failed"]:
                problems.append(f"a canary test that must fail was {f[0] if f else 'not run'}")
    outcomes = {t: o for t, o in run.outcomes.items() if not canaries.owns(t)}
    failures = [f for f in run.failures if not canaries.owns(f.test_id)]
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
