"""A requested change with no failing test: the test that shows it.

A request from a user (the CI bot's task, an issue's text) may come when no test fails: "add a
``--verbose`` flag". The agent then works from the request alone and must add or change a test
that shows the change: one that fails on the starting code and passes with the patch. Nothing else
counts, since a test that passes without the change shows nothing.

:func:`test_files` names the test files the patch adds or changes; they are the target after the
agent's work. :func:`run_without_change` runs them on the starting code with only the patch's test
files applied, in a fresh sandbox (a workspace the agent never touched), and :func:`shown_by` reads
off the tests that pass with the change and not without it.
"""

from __future__ import annotations

from clover_agent.agent.checkpoints import restore_workspace
from clover_agent.fix.patches import is_test_file, patch_sections
from clover_agent.sandboxes import SandboxSpec, create_sandbox
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


def test_files(patch: str) -> list[str]:
    """The test files (``test_*.py`` and the like, not ``conftest.py``) the patch adds or changes
    and keeps; paths with white space are left out (a target is split at white space)."""
    return [
        section.path
        for section in patch_sections(patch)
        if not section.deleted
        and is_test_file(section.path)
        and not section.path.endswith("conftest.py")
        and len(section.path.split()) == 1
    ]


def test_patch(patch: str) -> str:
    """The part of ``patch`` that changes test files (see :func:`~clover_agent.fix.patches.is_test_file`)."""
    return "".join(section.text for section in patch_sections(patch) if is_test_file(section.path))


async def run_without_change(kind: str, spec: SandboxSpec, patch: str, target: str) -> TestReport:
    """``target`` run in a fresh sandbox over the starting code with only the patch's test files
    applied."""
    async with create_sandbox(kind, spec) as sandbox:
        await restore_workspace(sandbox, test_patch(patch))
        return await run_tests_in(sandbox, target)


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
