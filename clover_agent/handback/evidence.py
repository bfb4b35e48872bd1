"""A requested change with no failing test: the test that shows it.

A request from a user (the CI bot's task, an issue's text) may come when no test fails: "add a
``--verbose`` flag". The agent then works from the request alone and must add or change a test
that shows the change: one that fails on the starting code and passes with the patch. Nothing else
counts, since a test that passes without the change shows nothing.

:func:`test_files` names the test files the patch adds or changes; they are the target after the
agent's work. :func:`run_without_change` runs them on the starting code with only the patch's test
files written (their exact bytes, from the host's patch), in a fresh sandbox (a workspace the agent
never touched), and :func:`shown_by` reads off the tests that pass with the change and not without it.
"""

from __future__ import annotations

from clover_agent.handback.patches import is_test_file
from clover_agent.handback.shadow import SYMLINK
from clover_agent.handback.stock import HandBackError, PatchSet, Stock
from clover_agent.sandboxes.base import Put, SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in


def request_task_text(suite: TestReport) -> str:
    """What the agent is asked to do when no test fails (after the user's request)."""
    return (
        f"No test fails now ({suite.summary().splitlines()[-1] if suite.command else 'the suite passes'}). "
        "Make the change the request asks for, and add a test that shows it: a test that fails without "
        "your change and passes with it, in the project's tests (a new test, or a changed one). Keep the "
        "rest of the suite passing. When the new test and the suite pass, call `finish` with a short "
        "summary of the change that names the test."
    )


def test_files(patch: PatchSet) -> list[str]:
    """The test files (``test_*.py`` and the like, not ``conftest.py``) the patch adds or changes
    and keeps; paths with white space are left out (a target is split at white space)."""
    return [
        change.path
        for change in patch.changes
        if change.new_mode
        and change.new_mode != SYMLINK
        and is_test_file(change.path)
        and not change.path.endswith("conftest.py")
        and len(change.path.split()) == 1
    ]


def _test_puts(patch: PatchSet) -> list[Put]:
    """The patch's changes to test files (``conftest.py`` too), as exact writes."""
    changes = [c for c in patch.changes if is_test_file(c.path)]
    blobs = patch.shadow.blobs({c.path: c.new_oid for c in changes if c.new_mode and c.new_mode != SYMLINK})
    puts = []
    for change in changes:
        if not change.new_mode:
            puts.append(Put(change.path, "absent"))
        elif change.new_mode == SYMLINK:
            puts.append(Put(change.path, "link", target=change.target or ""))
        else:
            puts.append(
                Put(change.path, "file", 0o755 if change.new_mode & 0o100 else 0o644, blobs[change.path])
            )
    return puts


async def run_without_change(
    kind: str,
    spec: SandboxSpec,
    patch: PatchSet,
    target: str,
    test_timeout: float | None,
    stock: Stock,
) -> TestReport:
    """``target`` run in a fresh sandbox over the starting code with only the patch's test files
    written (``test_timeout``: each test's own limit). The sandbox is made exactly the patch's
    start first (``stock``), whatever the user's tree holds now."""
    async with create_sandbox(kind, spec) as sandbox:
        await stock.make_like(sandbox, patch.base)
        try:
            await sandbox.put(_test_puts(patch))
        except (OSError, ValueError) as exc:
            raise HandBackError(f"could not write the patch's tests into a fresh sandbox: {exc}") from exc
        return await run_tests_in(sandbox, target, test_timeout=test_timeout)


def shown_by(after: TestReport, without: TestReport) -> list[str]:
    """The tests that pass with the change and do not without it (fail, error, or not even run:
    a test that cannot be collected without the change shows it too); none when the run without
    the change timed out, since then nothing can be told."""
    if without.timed_out:
        return []
    return sorted(
        test
        for test, outcome in after.outcomes.items()
        if outcome == "passed" and without.outcomes.get(test) != "passed"
    )
