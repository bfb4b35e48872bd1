"""A real :class:`PatchSet` for hand-back tests: a local sandbox over a real repository, the host's
start snapshot, a shell command standing in for the agent's edits, the host's end snapshot."""

from __future__ import annotations

from pathlib import Path

from clover_agent.errors import ExitCode
from clover_agent.fix.handback.stock import Stock
from clover_agent.fix.handback.verdict import Judgement, Verdict
from clover_agent.fix.report import Checked, FixReport, Kept, build_report
from clover_agent.sandboxes import create_sandbox
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
