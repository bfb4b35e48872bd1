"""Step 4 of ``fix``: verify the exact patch that is handed back, and judge the run.

The agent's sandbox is not where the patch is verified: it is closed once the patch is made on the
host, and a fresh sandbox from the same spec is made exactly the patched tree
(:meth:`Stock.make_like_final`), so nothing the agent left running (a daemon, a background job, a
patched ``.git``) is there. Two runs judge it, held out and as handed back
(:func:`verify_patch`); ``fixed`` needs both.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Awaitable, Callable

from clover_agent.events import EventBus, PhaseStarted, TestsRun
from clover_agent.handback.checks import (
    canary_folder,
    make_canaries,
    reviewed,
    take_canaries,
    with_canaries,
)
from clover_agent.handback.diagnosis import diagnose, workspace_module_names
from clover_agent.handback.heldout import HeldOut, files_with_tests, held_out
from clover_agent.handback.shadow import Change
from clover_agent.handback.stock import HandBackError, PatchSet, Stock
from clover_agent.handback.tamper import scan_changes
from clover_agent.handback.verdict import (
    COLLECTION_FAILURE,
    HandedBack,
    Judgement,
    judge,
    skipped_throughout,
    target_passes,
)
from clover_agent.handback.weakened import changed_doctests, weakened_tests
from clover_agent.sandboxes.base import WORKSPACE, Put, Sandbox, SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, default_test_timeout, run_tests_in
from clover_agent.tools.run_tests.detect import PYTHON_TEST_FILE
from clover_agent.tools.run_tests.guarded import FIND_PYTHON_GUARDED, INSTALLED_NAMES, PYTEST_MODULES
from clover_agent.tools.run_tests.independent import IndependentRun, run_independently, runnable


@dataclasses.dataclass(frozen=True)
class Verification:
    """The runs on the patched tree, and the verdict."""

    target_after: TestReport  # held out
    suite_after: TestReport | None  # held out
    handed_back: HandedBack | None  # the runs on the patch as handed back (None: the same tree)
    harness: list[str]  # what the patch changes in what judges it
    judgement: Judgement
    #: What each check of how the target passes did (:mod:`clover_agent.handback.checks`).
    checks: dict[str, object] = dataclasses.field(default_factory=dict)


def environment_errors(before: TestReport, after: TestReport, names: set[str]) -> set[str]:
    """Tests that failed before and after for a reason of the environment (a module that is not
    installed, a plugin's fixture missing: :func:`clover_agent.handback.diagnosis.diagnose` on each)."""
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


async def installed_modules(sandbox: Sandbox) -> tuple[set[str], frozenset[str]] | None:
    """The module names the sandbox's Python finds outside the workspace, and those of them pytest
    imports before any test runs (pytest's own, its plugins'); None when it cannot tell (no Python)."""
    command = f"{FIND_PYTHON_GUARDED}; " + '[ -n "$__py" ] || __py=python3; "$__py" -c '
    found = await sandbox.exec(command + shlex.quote(INSTALLED_NAMES), timeout=120, cwd=WORKSPACE)
    if found.exit_code != 0:
        return None
    lines = found.output.split("\n")
    plugins = {
        line.split()[1] for line in lines if line.startswith("pytest-plugin ") and len(line.split()) == 2
    }
    return {
        line.strip() for line in lines if line.strip() and " " not in line.strip()
    }, PYTEST_MODULES | plugins


#: At most this many tests that broke are run once more to tell a flaky one (more: a real breakage).
MAX_RERUN = 20


async def _flaky(
    sandbox: Sandbox, before: TestReport, after: TestReport, bus: EventBus, test_timeout: float | None
) -> tuple[set[str], list[str]]:
    """The tests that passed before, failed (or erred) in the held-out suite run, and pass when run
    once more, held out and guarded, in the same sandbox: flaky, so the suite's run vouches for
    nothing about them (the verdict is then at most "fixed, suite unverified"; never "fixed").
    Also what was wrong with that run's results channel (a forged pass there is a finding)."""
    broke = sorted(
        t
        for t, o in after.outcomes.items()
        if o in ("failed", "error") and before.outcomes.get(t) == "passed"
    )
    if not broke or len(broke) > MAX_RERUN or any(c.isspace() for t in broke for c in t):
        return set(), []  # none, too many to be chance, or ids a target cannot name
    await sandbox.stop_processes()
    bus.emit(
        PhaseStarted(
            phase="verification", detail=f"running the {len(broke)} test(s) that broke once more (held out)"
        )
    )
    again = await run_tests_in(
        sandbox, " ".join(broke), guarded=True, framework=after.framework, test_timeout=test_timeout
    )
    bus.emit(TestsRun(phase="suite_rerun", target=" ".join(broke), report=again.to_dict()))
    return {t for t in broke if again.outcomes.get(t) == "passed"}, again.integrity


def _changed_test_files(patch: PatchSet, keep: frozenset[str]) -> list[str]:
    """The Python test files the patch adds, changes or deletes (run as handed back)."""
    return [c.path for c in patch.changes if PYTHON_TEST_FILE.search(c.path) and c.path not in keep]


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
    keep_tests: frozenset[str] = frozenset(),
    test_timeout: float | None = None,
) -> Verification:
    """Make a fresh sandbox the patched tree and judge it by two runs.

    - ``run_suite``: runs the held-out suite, only when the target passes both ways.
    - ``keep_tests``: test files the held-out run keeps as patched (a change made from a request).
    - ``test_timeout``: each target test's own limit (None: a fifth of the run's).

    1. Held out, first, so nothing the patch's own tests run can linger into it: the starting commit's
       test infrastructure put back over the patched source (:mod:`clover_agent.handback.heldout`),
       pytest started guarded (:mod:`clover_agent.tools.run_tests.guarded`): the target, then the suite.
    2. As handed back (every process stopped, the workspace made the patched tree again): the target
       and the test files the patch adds.
    """
    bus.emit(PhaseStarted(phase="verification", detail="a fresh sandbox with the patched tree"))
    checks: dict[str, object] = {}
    independent: IndependentRun | None = None
    async with create_sandbox(kind, spec) as sandbox:
        await stock.make_like_final(sandbox, patch)
        modules = await installed_modules(sandbox)
        if modules is None and target_before.framework in ("pytest", "unittest"):
            raise HandBackError("the verification sandbox's Python could not list its installed modules")
        installed, harness_modules = modules or (set(), PYTEST_MODULES)
        test_files = files_with_tests(t for r in (target_before, suite_before) for t in r.outcomes)

        def plan_for(keep: frozenset[str]) -> HeldOut:
            return held_out(
                patch,
                target_ids=list(target_before.outcomes),
                installed=installed,
                harness_modules=harness_modules,
                test_files=test_files,
                keep=keep,
            )

        async def put_back(held: HeldOut) -> None:
            detail = f"the starting commit's tests and harness put back ({len(held.reverted)} path(s))"
            bus.emit(PhaseStarted(phase="verification", detail=detail))
            await _put(sandbox, held.puts, "the starting commit's tests for the held-out run")

        plan = plan_for(frozenset())
        target_plan = plan_for(keep_tests) if keep_tests else plan
        if target_plan.puts:
            await put_back(target_plan)
        folder = canary_folder(target_tests, list(target_before.outcomes))
        like = next(iter(target_before.outcomes), None) or next(iter(target_tests.split()), None)
        canaries = (
            make_canaries(folder, (like or "").split("::")[0])
            if target_before.framework == "pytest" and folder is not None
            else None
        )
        if canaries is not None:
            await _put(sandbox, [Put(canaries.path, "file", 0o644, canaries.source)], "the canary tests")
        await sandbox.stop_processes()  # nothing started before the held-out run is there during it
        bus.emit(
            PhaseStarted(phase="verification", detail=f"running the target tests {target_tests} (held out)")
        )
        target_after = await run_tests_in(
            sandbox,
            with_canaries(target_tests, canaries) if canaries else target_tests,
            guarded=True,
            framework=target_before.framework,
            test_timeout=test_timeout,
        )
        if canaries is not None:
            target_after, checks["canaries"] = take_canaries(target_after, canaries)
            await _put(sandbox, [Put(canaries.path, "absent")], "the canary tests")
        target_after = dataclasses.replace(target_after, target=target_tests)
        bus.emit(TestsRun(phase="target_after", target=target_tests, report=target_after.to_dict()))
        suite_after, names = None, set()
        flaky: set[str] = set()
        rerun_integrity: list[str] = []
        if target_passes(target_before, target_after):
            await sandbox.stop_processes()
            passed = runnable([t for t, o in target_after.outcomes.items() if o == "passed"])
            if passed:
                bus.emit(
                    PhaseStarted(
                        phase="verification",
                        detail=f"running {len(passed)} target test(s) again without pytest, in a fresh process",
                    )
                )
                independent = await run_independently(
                    sandbox, passed, test_timeout=test_timeout or default_test_timeout(DEFAULT_TIMEOUT_S)
                )
                checks["independent"] = independent.to_dict()
            if plan is not target_plan and plan.puts:  # a request's own tests: not in the suite's run
                await put_back(plan)
            bus.emit(PhaseStarted(phase="verification", detail="running the whole suite (held out)"))
            suite_after = await run_suite(sandbox)
            bus.emit(TestsRun(phase="suite_after", target="", report=suite_after.to_dict()))
            names = await workspace_module_names(sandbox)
            flaky, rerun_integrity = await _flaky(sandbox, suite_before, suite_after, bus, test_timeout)
        handed_back = None
        if plan.puts:  # else the held-out tree is the patch as handed back
            await sandbox.stop_processes()  # nothing of the held-out run lingers
            await stock.make_like_final(sandbox, patch)
            bus.emit(
                PhaseStarted(
                    phase="verification", detail=f"running {target_tests} on the patch as handed back"
                )
            )
            files = _changed_test_files(patch, keep_tests)
            target_handed_back = await run_tests_in(sandbox, target_tests, test_timeout=test_timeout)
            bus.emit(
                TestsRun(phase="target_handed_back", target=target_tests, report=target_handed_back.to_dict())
            )
            tests_handed_back = None
            present = [f for f in files if f in {c.path for c in patch.changes if c.new_mode}]
            if files and HandedBack(target_handed_back).problem(target_before) is None:
                tests_handed_back = (
                    await run_tests_in(sandbox, " ".join(present), test_timeout=test_timeout)
                    if present  # else only deletions: every test of those files is gone
                    else TestReport(framework=target_before.framework, command="", target="", exit_code=0)
                )
                bus.emit(
                    TestsRun(
                        phase="tests_handed_back",
                        target=" ".join(present),
                        report=tests_handed_back.to_dict(),
                    )
                )
            handed_back = HandedBack(target_handed_back, files, tests_handed_back)
    before, after = _python_sides(patch)
    findings = scan_changes(before, after)
    checks["scan"] = [f.describe() for f in findings]
    targets = list(target_before.outcomes)
    passed = [
        t for t, o in suite_before.outcomes.items() if o == "passed" and t not in target_before.outcomes
    ]
    judgement = judge(
        target_before,
        target_after,
        suite_before,
        suite_after,
        files_changed=patch.files,
        weakened=weakened_tests(targets, before, after) + changed_doctests(targets, before, after),
        doctests_changed=changed_doctests(passed, before, after),
        environment_errors=set()
        if suite_after is None
        else environment_errors(suite_before, suite_after, names),
        handed_back=handed_back,
        tests_changed=plan.reverted,
        flaky=flaky,
    )
    # target tests skipped before and after: listed whatever the verdict (they checked nothing)
    skipped = skipped_throughout(target_before, target_after)
    judgement = dataclasses.replace(judgement, tests_changed=plan.reverted, skipped=skipped)
    review = [f"{f.describe()} (scan)" for f in findings]
    review += [f"held-out target run: {p}" for p in target_after.integrity]
    review += [f"held-out suite run: {p}" for p in (suite_after.integrity if suite_after else [])]
    review += [f"the broken tests' second run: {p}" for p in rerun_integrity]
    if independent is not None:
        review += [f"independent run: {p}" for p in independent.problems]
        review += [
            f"{t} passes under pytest but fails when run again without it, in a fresh process (independent run)"
            for t in independent.disagrees(target_after.outcomes)
        ]
    judgement = reviewed(judgement, review)
    return Verification(target_after, suite_after, handed_back, plan.harness, judgement, checks)


async def _put(sandbox: Sandbox, puts: list[Put], what: str) -> None:
    try:
        await sandbox.put(puts)
    except (OSError, ValueError) as exc:
        raise HandBackError(f"could not write {what} into the verification sandbox: {exc}") from exc
