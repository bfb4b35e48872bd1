"""Handing a run's verified patch back to the user's working tree, and the run's last word.

:func:`hand_back` reads the report and decides, for how the user chose (``--yes``, ``--dry-run``,
asking at a terminal), whether the patch is applied (the verified bytes, all or nothing:
:func:`clover_agent.fix.handback.apply.apply_patch_set`); it returns a
:class:`~clover_agent.fix.report.HandBackOutcome` (exit code, message, what became of the patch).
What is offered, what needs a yes and what is never handed back are in README ("Needs a yes at
a terminal", "Never handed back"). :func:`record_outcome` writes the report with that outcome into ``summary.json`` and as the
trajectory's last line, so both say what the process did.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path

from clover_agent.agent.trajectory import TrajectoryWriter
from clover_agent.errors import ExitCode
from clover_agent.events import TaskFinished
from clover_agent.fix.handback.apply import ApplyInterrupted, PatchNotApplied, apply_patch_set
from clover_agent.fix.handback.patches import apply_command
from clover_agent.fix.handback.snapshot import left_out_lines
from clover_agent.fix.handback.verdict import Verdict
from clover_agent.fix.report import FixReport, HandBack, HandBackOutcome, write_summary
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
) -> HandBackOutcome:
    """Apply the patch as the user chose (see the module docstring); returns the command's exit
    code and message (empty when there is nothing more to say) and what became of the patch.
    ``confirm`` answers the question: whether to apply, or the paths of the files to apply (the
    person chose file by file; the others are left out, said so)."""
    verdict_code = report.exit_code
    if not report.fixed or report.patch_set is None:
        return HandBackOutcome(verdict_code, report.message)
    how = apply_hint(report, repo)
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
    if mode == ASK:
        if confirm is None:
            say(
                f"No terminal to confirm, so the patch was not applied (use --yes to apply). To apply it: {how}"
            )
            return HandBackOutcome(verdict_code, kind=HandBack.NO_TERMINAL)
        answer = confirm(question(report, repo))
        if not answer:
            say(f"Not applied. To apply it later: {how}")
            return HandBackOutcome(verdict_code, kind=HandBack.DECLINED)
        if isinstance(answer, list):
            chosen = [c for c in report.patch_set.changes if c.path in answer]
            patch_set = dataclasses.replace(report.patch_set, changes=chosen)
    try:
        files = apply_patch_set(repo, patch_set)
    except PatchNotApplied as exc:
        return HandBackOutcome(
            ExitCode.FAILURE, f"{exc.message} To apply it yourself: {how}", HandBack.REFUSED, exc.message
        )
    except ApplyInterrupted as exc:
        done = "applied in full" if exc.applied else "not applied"
        return HandBackOutcome(ExitCode.INTERRUPTED, exc.message, HandBack.INTERRUPTED, done)
    left = [path for path in report.patch_set.files if path not in patch_set.files]
    say(f"Applied to {repo}: {shown_names(files)}")
    if held:
        say("Not applied, they need your yes at a terminal (--yes does not cover them): "
            + "; ".join(f"{shown_names([path])} ({terminal_safe(why, single_line=True)})" for path, why in held.items())
            + f". The whole patch: {how}")  # fmt: skip
    elif left:
        say(f"Not applied: {shown_names(left)}. The whole patch: {how}")
    detail = f"{', '.join(files)}; not applied: {', '.join(left)}" if left else ""
    return HandBackOutcome(verdict_code, kind=HandBack.APPLIED, detail=detail)


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
