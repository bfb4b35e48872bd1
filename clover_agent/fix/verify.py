"""Step 4 of ``fix``: verify the exact patch that is handed back, and judge the run.

The agent's sandbox is not where the patch is verified: after :meth:`Stock.record_end` (every
process killed, the files read back, the patch made on the host) it is closed, and a fresh sandbox
from the same spec is made exactly the patched tree (:meth:`Stock.make_like_final`); the target and
the suite run there. So what the tests saw is, byte for byte, what the user's tree gets, and
nothing the agent left running (a daemon, a background job, a patched ``.git``) is there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from clover_agent.events import EventBus, PhaseStarted, TestsRun
from clover_agent.fix.diagnosis import diagnose, workspace_module_names
from clover_agent.fix.shadow import Change
from clover_agent.fix.stock import PatchSet, Stock
from clover_agent.fix.verdict import COLLECTION_FAILURE, Judgement, judge, target_passes
from clover_agent.fix.weakened import weakened_tests
from clover_agent.sandboxes import SandboxSpec, create_sandbox
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in


@dataclasses.dataclass
class Verification:
    """The runs on the patched tree, and the verdict."""

    target_after: TestReport
    suite_after: TestReport | None
    judgement: Judgement


def environment_errors(before: TestReport, after: TestReport, names: set[str]) -> set[str]:
    """Tests that failed before and after for a reason of the environment (a module that is not
    installed, a plugin's fixture missing: :func:`clover_agent.fix.diagnosis.diagnose` on each)."""
    failed_before = {f.test_id for f in before.failures}
    found = set()
    for failure in after.failures:
        if failure.test_id not in failed_before or failure.message == COLLECTION_FAILURE:
            continue
        alone = TestReport(
            framework=after.framework,
            command="",
            target=None,
            exit_code=1,
            failures=[dataclasses.replace(failure, kind="error")],
            outcomes={failure.test_id: "error"},
        )
        if diagnose(alone, names) is not None:
            found.add(failure.test_id)
    return found


def _python_sides(patch: PatchSet) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """The bytes before and after of every changed ``.py`` file."""
    python: list[Change] = [c for c in patch.changes if c.path.endswith(".py")]
    old = patch.shadow.blobs({c.path: c.old_oid for c in python if c.old_mode})
    new = patch.shadow.blobs({c.path: c.new_oid for c in python if c.new_mode})
    return {c.path: old.get(c.path) for c in python}, {c.path: new.get(c.path) for c in python}


async def verify_patch(
    spec: SandboxSpec,
    kind: str,
    stock: Stock,
    patch: PatchSet,
    *,
    target_tests: str,
    target_before: TestReport,
    suite_before: TestReport,
    bus: EventBus,
    run_suite: Callable[[Sandbox], Awaitable[TestReport]],
) -> Verification:
    """Make a fresh sandbox the patched tree, run the target (then, if it passes, the suite,
    through ``run_suite``) there, and judge."""
    bus.emit(PhaseStarted(phase="verification", detail="a fresh sandbox with the patched tree"))
    async with create_sandbox(kind, spec) as sandbox:
        await stock.make_like_final(sandbox, patch)
        bus.emit(PhaseStarted(phase="verification", detail=f"running the target tests {target_tests}"))
        target_after = await run_tests_in(sandbox, target_tests)
        bus.emit(TestsRun(phase="target_after", target=target_tests, report=target_after.to_dict()))
        suite_after = None
        if target_passes(target_before, target_after):
            bus.emit(PhaseStarted(phase="verification", detail="running the whole suite"))
            suite_after = await run_suite(sandbox)
            bus.emit(TestsRun(phase="suite_after", target="", report=suite_after.to_dict()))
            names = await workspace_module_names(sandbox)
        else:
            names = set()
    before, after = _python_sides(patch)
    judgement = judge(
        target_before,
        target_after,
        suite_before,
        suite_after,
        files_changed=patch.files,
        weakened=weakened_tests(list(target_before.outcomes), before, after),
        environment_errors=set()
        if suite_after is None
        else environment_errors(suite_before, suite_after, names),
    )
    return Verification(target_after, suite_after, judgement)
