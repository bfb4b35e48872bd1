"""Handing a run's verified patch back to the user's working tree, and the run's last word.

:func:`hand_back` reads the report and decides, for how the user chose (``--yes``, ``--dry-run``,
asking at a terminal), whether the patch is applied (the verified bytes, all or nothing:
:func:`clover_agent.handback.apply.apply_patch_set`); it returns a
:class:`~clover_agent.fix.report.HandBackOutcome` (exit code, message, what became of the patch).
What is offered, what needs a yes and what is never handed back are in README ("Needs a yes at
a terminal", "Never handed back"). :func:`record_outcome` writes the report with that outcome into ``summary.json`` and as the
trajectory's last line, so both say what the process did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from clover_agent.agent.trajectory import TrajectoryWriter
from clover_agent.errors import ExitCode
from clover_agent.events import EventBus, HookRan, TaskFinished
from clover_agent.fix.report import FixReport, HandBack, HandBackOutcome, write_summary
from clover_agent.handback.apply import ApplyInterrupted, PatchNotApplied, apply_patch_set
from clover_agent.handback.judging import Checked
from clover_agent.handback.patches import apply_command
from clover_agent.handback.session import veto_check
from clover_agent.handback.snapshot import left_out_lines
from clover_agent.handback.stock import PatchSet
from clover_agent.handback.verdict import Verdict
from clover_agent.hooks import HookConfig, Hooks, hook_line
from clover_agent.safe_text import shown_names, terminal_safe

#: How the user chose: apply without asking, never apply, or ask (``confirm``).
YES, DRY_RUN, ASK = "yes", "dry run", "ask"


def apply_hint(report: FixReport, repo: Path) -> str:
    """The command that applies the kept patch by hand."""
    return shlex.join(apply_command(repo, report.patch_path))


def question(report: FixReport, repo: Path) -> str:
    """What the user is asked before the patch is applied: every file, and what needs a look."""
    assert report.patch_set is not None
    lines = [f"The patch changes {len(report.patch_set.files)} file(s) in {repo}:"]
    notes = dict(report.patch_set.to_confirm)
    for change in report.patch_set.changes:
        extra = f" ({shown_names(notes[change.path], '; ')})" if change.path in notes else ""
        lines.append(f"  {change.status:<12} {shown_names([change.path])}{extra}")
    lines.extend(f"  left out     {line}" for line in left_out_lines(report.left_out))
    if report.verdict == Verdict.FIXED_UNVERIFIED:
        lines.append("The target passes, but the rest of the suite could not be checked.")
    if report.verdict == Verdict.NEEDS_REVIEW:
        lines.append(
            "NEEDS REVIEW: the target passes, but checks of how it passes found (look before applying):"
        )
        lines.extend(f"  - {terminal_safe(item, single_line=True)}" for item in report.review[:10])
        if len(report.review) > 10:
            lines.append(f"  - and {len(report.review) - 10} more (summary.json's review)")
    if notes:
        lines.append("It holds changes beyond text edits (marked above): check them.")
    lines.append(f"Apply it to {repo}? [y/N] ")
    return "\n".join(lines)


def hand_back(
    report: FixReport,
    repo: Path,
    *,
    mode: str,
    confirm: Callable[[str], bool | list[str]] | None = None,
    say: Callable[[str], None] = print,
    reverify: Callable[[PatchSet], Checked] | None = None,
    markers: bool = False,
    veto: Callable[[PatchSet], str | None] | None = None,
) -> HandBackOutcome:
    """Apply the patch as the user chose (see the module docstring); returns the command's exit code
    and message (empty when there is nothing more to say) and what became of the patch.

    - ``confirm``: answers the question: whether to apply, or the paths of the files to apply (the
      person chose file by file; the others are left out, said so).
    - ``reverify``: verifies a part of the patch again on its own (held out, in a fresh sandbox).
    - ``markers``: where the agent's change overlaps an edit the user made since the run started,
      write both between conflict markers (else the user's side is kept and the overlap named).
    - ``veto``: the user's PreHandBack hooks, run on what is about to be applied: a reason when
      one vetoes it (then nothing is written).

    When only part of the patch is to be applied (``--yes`` leaving out what needs a yes, or a choice
    file by file), that part is applied only if ``reverify``'s verdict on it is a fix, and that verdict
    and its exit code are then the run's: no verdict describes bytes other than those written. Without
    ``reverify`` such a part is not applied.
    """
    verdict_code = report.exit_code
    review = report.verdict == Verdict.NEEDS_REVIEW
    if not (report.fixed or review) or report.patch_set is None:
        return HandBackOutcome(verdict_code, report.message)
    how = apply_hint(report, repo)
    if review and mode == YES:  # a person looks first: --yes never applies it
        message = f"{report.message}. Not applied: a patch that needs review is applied only at a terminal's yes, or by you: {how}"
        return HandBackOutcome(verdict_code, message, HandBack.REFUSED, "needs review")
    patch_set = report.patch_set  # what is applied: all of it, or the files the person chose
    if not report.patch_set.changes:
        return HandBackOutcome(verdict_code, kind=HandBack.NOTHING_TO_APPLY)
    if mode == DRY_RUN:
        say(f"Dry run: the patch was not applied. To apply it: {how}")
        return HandBackOutcome(verdict_code, kind=HandBack.DRY_RUN)
    held: dict[str, str] = {}  # what --yes leaves out, by its paths' rules
    if mode == YES:
        beyond = [(c.path, c.notes) for c in report.patch_set.changes if c.notes]
        held = report.patch_set.needing_yes
        rest = [c for c in report.patch_set.changes if c.path not in held]
        if beyond or not rest:
            shown = "; ".join(
                f"{shown_names([p])}: {shown_names(n)}" for p, n in beyond or report.patch_set.to_confirm
            )
            what = "changes beyond text edits" if beyond else "only changes that need a yes"
            message = (
                f"the patch was not applied: it holds {what} ({shown}), which need your confirmation at a "
                f"terminal (--yes does not cover them). Review it and apply it yourself: {how}"
            )
            return HandBackOutcome(ExitCode.FAILURE, message, HandBack.REFUSED, message)
        patch_set = dataclasses.replace(report.patch_set, changes=rest)
    subset: Checked | None = None
    if mode == ASK:
        if confirm is None:
            use = "review it first" if review else "use --yes to apply"
            say(f"No terminal to confirm, so the patch was not applied ({use}). To apply it: {how}")
            return HandBackOutcome(verdict_code, kind=HandBack.NO_TERMINAL)
        answer = confirm(question(report, repo))
        if not answer:
            say(f"Not applied. To apply it later: {how}")
            return HandBackOutcome(verdict_code, kind=HandBack.DECLINED)
        if isinstance(answer, list):
            chosen = [c for c in report.patch_set.changes if c.path in answer]
            patch_set = dataclasses.replace(report.patch_set, changes=chosen)
    if patch_set.files != report.patch_set.files:  # part of it: verified on its own first
        part = tuple(patch_set.files)
        left = [path for path in report.patch_set.files if path not in part]
        if reverify is None or report.stock is None:
            message = (
                f"not applied: the files to apply ({shown_names(list(part))}) were not verified without "
                f"the others ({shown_names(left)}). The whole patch: {how}"
            )
            return HandBackOutcome(
                ExitCode.FAILURE, message, HandBack.REFUSED, "the part to apply is unverified"
            )
        say(
            f"Verifying the files to apply on their own, without {shown_names(left)} (held out, in a fresh sandbox)"
        )
        patch_set = report.stock.subset(report.patch_set, list(part))
        subset = reverify(patch_set)
        judged = subset.judged
        if not judged.verdict.fixed:
            message = (
                f"not applied: without {shown_names(left)}, the files to apply ({shown_names(list(part))}) are "
                f"`{judged.verdict}` on their own: {judged.message}. The whole patch: {how}"
            )
            why = f"the part to apply is {judged.verdict} on its own"
            return HandBackOutcome(judged.exit_code, message, HandBack.REFUSED, why, subset, part)
        verdict_code = judged.exit_code
    vetoed = veto(patch_set) if veto is not None else None
    if vetoed is not None:
        message = f"{vetoed}. To apply it yourself: {how}"
        return HandBackOutcome(ExitCode.FAILURE, message, HandBack.REFUSED, vetoed)
    try:
        applied = apply_patch_set(repo, patch_set, markers=markers)
    except PatchNotApplied as exc:
        return HandBackOutcome(
            ExitCode.FAILURE, f"{exc.message} To apply it yourself: {how}", HandBack.REFUSED, exc.message
        )
    except ApplyInterrupted as exc:
        done = "applied in full" if exc.applied else "not applied"
        return HandBackOutcome(ExitCode.INTERRUPTED, exc.message, HandBack.INTERRUPTED, done)
    files = applied.files
    left = [path for path in report.patch_set.files if path not in patch_set.files]
    say(f"Applied to {repo}: {shown_names(files)}")
    for note in applied.notes():  # merged with the user's edits, or left out of the tree
        say(note)
    if held:
        say("Not applied, they need your yes at a terminal (--yes does not cover them): "
            + "; ".join(f"{shown_names([path])} ({terminal_safe(why, single_line=True)})" for path, why in held.items())
            + f". The whole patch: {how}")  # fmt: skip
    elif left:
        say(f"Not applied: {shown_names(left)}. The whole patch: {how}")
    left += list(applied.left_out)
    detail = f"{', '.join(files)}; not applied: {', '.join(left)}" if left else ""
    if applied.merged:
        detail = (detail or ", ".join(files)) + f"; merged with your edits: {', '.join(applied.merged)}"
    if subset is not None:
        message = f"the files applied, verified on their own: {subset.judged.message}"
        return HandBackOutcome(verdict_code, message, HandBack.APPLIED, detail, subset, tuple(files))
    return HandBackOutcome(verdict_code, kind=HandBack.APPLIED, detail=detail)


def hook_veto(
    hooks: Sequence[HookConfig],
    report: FixReport,
    repo: Path,
    *,
    environ: Mapping[str, str],
    say: Callable[[str], None] = print,
) -> Callable[[PatchSet], str | None] | None:
    """``hand_back``'s ``veto``: the run's PreHandBack hooks, each run recorded in its trajectory
    and a failure or a veto said (None: there are none)."""
    if not any(hook.event == "PreHandBack" for hook in hooks):
        return None

    async def check(patch_set: PatchSet) -> str | None:
        bus = EventBus()
        writer = TrajectoryWriter(report.trajectory_path, key=report.key)
        bus.subscribe(writer)

        def show(event: object) -> None:
            line = hook_line(event) if isinstance(event, HookRan) else None
            if line is not None:
                say(f"hook: {line}")

        bus.subscribe(show)
        runner = Hooks(
            hooks,
            bus,
            session_id=report.run_id,
            repo=repo,
            transcript=report.trajectory_path,
            environ=environ,
        )
        try:
            await veto_check(runner, patch_set, str(report.verdict))
        except PatchNotApplied as exc:
            return exc.message
        finally:
            writer.close()
        return None

    return lambda patch_set: asyncio.run(check(patch_set))


def record_outcome(report: FixReport, outcome: HandBackOutcome, *, command: str = "fix") -> FixReport:
    """Write the report with the hand-back's ``outcome`` (the command's real exit code and message)
    into ``summary.json`` and as the trajectory's last line, and return it; the shadow repository
    is removed (``patch.diff`` stays)."""
    final = report.with_outcome(outcome)
    summary = write_summary(final)
    writer = TrajectoryWriter(final.trajectory_path, key=final.key)
    try:
        writer(
            TaskFinished(
                run_id=final.run_id,
                command=command,
                exit_code=int(final.exit_code),
                message=final.message,
                report=summary,
            )
        )
    finally:
        writer.close()
    if final.stock is not None:
        final.stock.discard()
    return final
