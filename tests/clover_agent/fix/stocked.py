"""A real :class:`PatchSet` for hand-back tests: a local sandbox over a real repository, the host's
start snapshot, a shell command standing in for the agent's edits, the host's end snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clover_agent.errors import ExitCode
from clover_agent.events import EventBus
from clover_agent.fix.report import FixReport, build_report
from clover_agent.handback.judging import Checked
from clover_agent.handback.stock import Kept, PatchSet, Stock
from clover_agent.handback.verdict import Judgement, Verdict
from clover_agent.handback.verify import verify_patch
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in
from tests.sandbox_specs import sandbox_spec


async def stocked_report(repo: Path, run_dir: Path, command: str, *, kind: str = "local") -> FixReport:
    """A report whose patch is what ``command`` (run in the sandbox's workspace) changed, judged
    fixed (the hand-back is what these tests look at; its verdict tests are elsewhere)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stock = Stock(run_dir, repo)
    async with create_sandbox(kind, sandbox_spec(repo)) as sandbox:
        await stock.record_start(sandbox)
        result = await sandbox.exec(command, timeout=600)
        assert result.exit_code == 0, result.output
        patch = await stock.record_end(sandbox)
    report = build_report(
        run_dir.name,
        run_dir,
        exit_code=ExitCode.OK,
        message="fixed",
        elapsed_s=0.0,
        stock=stock,
        kept=Kept(patch),
        checked=Checked(Judgement(Verdict.FIXED, ExitCode.OK, "fixed")),
    )
    report.patch_path.write_bytes(patch.patch)
    return report


def verifier(
    repo: Path, report: FixReport, target: str = "tests/test_calculator.py::test_add", *, kind: str = "local"
) -> Callable[[PatchSet], Checked]:
    """A real re-verification of part of ``report``'s patch, for the hand-back's ``reverify``: the
    target and the suite run on the starting code, then the part judged as ``fix`` judges a patch
    (:func:`verify_patch`: held out, in a fresh sandbox, with the checks). Usable from inside a
    running event loop (it runs in a thread of its own)."""
    assert report.stock is not None
    stock = report.stock

    async def run(part: PatchSet) -> Checked:
        spec = sandbox_spec(repo)
        async with create_sandbox(kind, spec) as sandbox:
            target_before = await run_tests_in(sandbox, target)
            suite_before = await run_tests_in(sandbox, None)

        async def suite(sandbox: Sandbox) -> TestReport:
            return await run_tests_in(sandbox, None, guarded=True)

        verification = await verify_patch(
            spec,
            kind,
            stock,
            part,
            target_tests=target,
            target_before=target_before,
            suite_before=suite_before,
            bus=EventBus(),
            run_suite=suite,
        )
        return Checked(verification.judgement, verification)

    def reverify(part: PatchSet) -> Checked:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, run(part)).result()

    return reverify
