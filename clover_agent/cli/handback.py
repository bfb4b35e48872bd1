"""The end of ``clover-agent fix`` at the user's side: the summary, and the confirmation.

:func:`hand_back` hands the patch back through :func:`clover_agent.fix.decision.hand_back` (which
applies the verified bytes, all or nothing, and says what the command ends with). What this module
adds is the person's side at a terminal (without ``--yes`` / ``--dry-run``): the diff first,
coloured, through a pager when it is longer than the screen (``PAGER``, default ``less -R -F -X``),
then the files and the choices: apply it, choose file by file (those chosen are applied together;
the tests ran on the whole patch), show the diff again, or not apply it. Ctrl-C or Ctrl-D at the
question applies nothing and says how to apply it later.
"""

from __future__ import annotations

import argparse
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from rich.console import Console
from rich.text import Text

from clover_agent.errors import RUN_ERRORS, CloverError, ExitCode, exit_code_for, message_of
from clover_agent.fix import decision
from clover_agent.fix.console import write_plain
from clover_agent.fix.progress import RunFigures, duration
from clover_agent.fix.report import FixReport, HandBack, HandBackOutcome
from clover_agent.handback.judging import Checked
from clover_agent.handback.snapshot import left_out_lines
from clover_agent.handback.stock import PatchSet
from clover_agent.handback.verdict import Verdict
from clover_agent.safe_text import shown_names, terminal_safe

DEFAULT_PAGER = "less -R -F -X"

_FILE_SECTION = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a git patch."""

    path: str
    text: str

    @property
    def counts(self) -> str:
        lines = self.text.splitlines()
        added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
        removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
        return f"+{added} -{removed}"


def split_patch(patch: str) -> list[FilePatch]:
    """The patch's sections, one per file (a rename is named by its new path)."""
    starts = list(_FILE_SECTION.finditer(patch))
    return [
        FilePatch(
            match.group(2),
            patch[match.start() : starts[i + 1].start() if i + 1 < len(starts) else len(patch)],
        )
        for i, match in enumerate(starts)
    ]


# -- the summary -------------------------------------------------------------------------------------


def _counts(report: Any) -> str:
    if report is None:
        return "not run"
    text = f"{report.passed} passed, {report.failed} failed"
    if report.errors:
        text += f", {report.errors} errors"
    if report.skipped:
        text += f", {report.skipped} skipped"
    return text


#: The header of a run that stopped before the agent worked, by its exit code: it was not tried.
NOT_RUN = {
    ExitCode.USAGE: "NOT RUN: usage or configuration error",
    ExitCode.MODEL_UNAVAILABLE: "NOT RUN: model backend unavailable",
    ExitCode.SANDBOX_UNAVAILABLE: "NOT RUN: sandbox or project environment not ready",
}


def print_summary(report: FixReport, figures: RunFigures, console: Console) -> None:
    """The verdict, the tests before and after, what changed, the run's figures and its files. A run
    that did not succeed is named here by its exit code; its reason is said once, by the command."""

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    if report.verdict == Verdict.FIXED:
        status, style = f"FIXED — {terminal_safe(report.message, single_line=True)}", "bold green"
    elif report.verdict == Verdict.FIXED_UNVERIFIED:
        status, style = "FIXED, SUITE UNVERIFIED (exit 8)", "bold yellow"
    elif report.verdict == Verdict.NEEDS_REVIEW:
        status, style = "NEEDS REVIEW (exit 9)", "bold yellow"
    elif report.verdict == Verdict.TESTS_WEAKENED:
        status, style = "TESTS WEAKENED (exit 1)", "bold red"
    elif report.verdict == Verdict.TESTS_CHANGED:
        status, style = "TESTS CHANGED (exit 1)", "bold red"
    elif report.exit_code == ExitCode.NOTHING_TO_FIX:
        status, style = "NOTHING TO FIX (exit 5)", "bold yellow"
    elif report.agent is None and report.exit_code in NOT_RUN:
        status, style = f"{NOT_RUN[ExitCode(report.exit_code)]} (exit {int(report.exit_code)})", "bold red"
    elif report.exit_code == ExitCode.INTERRUPTED:
        status, style = "INTERRUPTED (exit 130)", "bold yellow"
    else:
        status, style = f"NOT FIXED (exit {int(report.exit_code)})", "bold red"
    console.print()
    console.print(Text(f"clover-agent fix: {status}", style=style))
    lines = []
    if report.selection:
        lines.append(f"  target      {terminal_safe(report.selection, single_line=True)}")
    lines.append(
        f"  before      target: {_counts(report.target_before)}; suite: {_counts(report.suite_before)}"
    )
    if report.target_after is not None:
        lines.append(
            f"  after       target: {_counts(report.target_after)}; suite: {_counts(report.suite_after)}"
        )
    if report.target_handed_back is not None:
        lines.append(f"  as handed   target: {_counts(report.target_handed_back)} (the patch's own tests)")
    if report.regressions:
        lines.append(f"  broke       {shown_names(report.regressions)}")
    if report.target_skipped:
        items = report.target_skipped
        more = f" (+{len(items) - 10})" if len(items) > 10 else ""
        lines.append(
            f"  skipped     {shown_names(items[:10], '; ')}{more} (target tests skipped before and after: not checked)"
        )
    for label, items in (
        ("still fails", report.still_failing),
        ("unverified", report.unverified),
        ("review", report.review),
        ("weakened", report.weakened),
        ("harness", report.harness),
    ):
        if items:
            more = f" (+{len(items) - 10})" if len(items) > 10 else ""
            lines.append(f"  {label:<11} {shown_names(items[:10], '; ')}{more}")
    if report.agent is not None:
        notes = dict(report.patch_set.to_confirm) if report.patch_set is not None else {}
        changed = [f + (f" ({'; '.join(notes[f])})" if f in notes else "") for f in report.files_changed]
        lines.append(f"  changed     {shown_names(changed) or 'nothing'}")
        lines.extend(f"  left out    {line}" for line in left_out_lines(report.left_out))
        if report.test_files_changed:
            lines.append(
                f"  WARNING     test files changed: {shown_names(report.test_files_changed)} — review them"
            )
        note = " (replayed turns, not a model)" if report.backend.startswith("replay") else ""
        lines.append(
            f"  agent       {report.agent.outcome}; {figures.final()}; backend "
            f"{terminal_safe(report.backend, single_line=True)}{note}"
        )
        lines.append(f"  patch       {rel(report.patch_path)}")
    lines.append(f"  trajectory  {rel(report.trajectory_path)}")
    lines.append(f"  time        {duration(report.elapsed_s)}")
    write_plain(console, "\n".join(lines))


# -- handing the patch back --------------------------------------------------------------------------


def hand_back(
    report: FixReport,
    repo: Path,
    args: argparse.Namespace,
    console: Console,
    *,
    environ: Mapping[str, str] | None = None,
    ask: Callable[[str], str] = input,
    reverify: Callable[[PatchSet], Checked] | None = None,
    veto: Callable[[PatchSet], str | None] | None = None,
) -> int:
    """Hand the patch back as ``args`` say (``--yes``, ``--dry-run``, else ask at a terminal; see
    the module docstring), record the command's exit code and message in the run's summary.json
    and trajectory (:func:`clover_agent.fix.decision.record_outcome`; also when the apply itself
    failed), and return it (a :class:`CloverError` for a non-zero one). ``ask`` reads one answer."""
    mode = decision.DRY_RUN if args.dry_run else decision.YES if args.yes else decision.ASK
    confirm = None
    if mode == decision.ASK and sys.stdin.isatty():
        confirm = _Confirmation(report, console, dict(environ or {}), ask)
    try:
        outcome = decision.hand_back(
            report,
            repo,
            mode=mode,
            confirm=confirm,
            say=lambda text: write_plain(console, text),
            reverify=reverify,
            markers=bool(getattr(args, "conflict_markers", False)),
            veto=veto,
        )
    except KeyboardInterrupt:  # at the question: nothing was applied
        message = (
            "interrupted before the patch was applied: your tree is unchanged. To apply it later: "
            + decision.apply_hint(report, repo)
        )
        outcome = HandBackOutcome(ExitCode.INTERRUPTED, message, HandBack.INTERRUPTED, "not applied")
    except (*RUN_ERRORS, OSError) as exc:  # host git or the file system failed: the apply undid itself
        message = f"the patch was not applied: {message_of(exc)}. The patch is kept: {report.patch_path}"
        outcome = HandBackOutcome(exit_code_for(exc), message, HandBack.FAILED, message_of(exc))
    final = decision.record_outcome(report, outcome)
    if final.exit_code != ExitCode.OK:
        if outcome.kind in (HandBack.FAILED, HandBack.REFUSED) and report.verdict is not None:
            # the header above named the verdict: this one names what became of the patch
            said = f"{str(report.verdict).upper()}, NOT APPLIED (exit {int(final.exit_code)})"
            console.print(Text(f"clover-agent fix: {said}", style="bold yellow"))
        raise CloverError(final.message, exit_code=final.exit_code)
    return int(final.exit_code)


class _Confirmation:
    """The question at a terminal: the diff, then the files and the choices. Called with
    :func:`clover_agent.fix.decision.question`'s text (the files, what needs a look); returns
    whether to apply the patch, or the files chosen one by one."""

    def __init__(
        self, report: FixReport, console: Console, environ: dict[str, str], ask: Callable[[str], str]
    ):
        self.sections = split_patch(report.patch_path.read_text(encoding="utf-8", errors="replace"))
        self.console, self.environ, self.ask = console, environ, ask

    def __call__(self, question: str) -> bool | list[str]:
        files = question.rstrip().rsplit("\n", 1)[0]  # its last line is a y/N question: ours follow
        several = len(self.sections) > 1
        choices = (
            "[y] yes / [f] choose files / [d] diff again / [N] no"
            if several
            else "[y] yes / [d] diff again / [N] no"
        )
        show_diff(self.sections, self.console, self.environ)
        while True:
            try:
                answer = self.ask(f"{files}\nApply it? {choices}: ").strip().lower()
            except EOFError:  # Ctrl-D: no
                self.console.print()
                return False
            if answer in ("d", "diff"):
                show_diff(self.sections, self.console, self.environ)
            elif several and answer in ("f", "files"):
                return [s.path for s in self.sections if self._one(s)]
            else:
                return answer in ("y", "yes")

    def _one(self, section: FilePatch) -> bool:
        try:
            return self.ask(
                f"  apply {shown_names([section.path])} ({section.counts})? [y/N] "
            ).strip().lower() in (
                "y",
                "yes",
            )
        except EOFError:
            return False


def show_diff(sections: list[FilePatch], console: Console, environ: dict[str, str]) -> None:
    """The diff, coloured at a colour terminal, through the pager when longer than the screen."""
    text = "".join(s.text for s in sections)
    if len(text.splitlines()) + 4 <= console.height:
        console.print(colored_diff(text), end="")
        return
    rendered = io.StringIO()
    system = cast(Literal["auto", "standard", "256", "truecolor", "windows"] | None, console.color_system)
    Console(file=rendered, force_terminal=system is not None, color_system=system,
            width=console.width, markup=False, highlight=False, soft_wrap=True).print(colored_diff(text), end="")  # fmt: skip
    pager = shlex.split(environ.get("PAGER") or DEFAULT_PAGER)
    try:
        subprocess.run(pager, input=rendered.getvalue(), text=True, check=False)
    except OSError:  # no such pager: print it as it is
        console.print(colored_diff(text), end="")


def colored_diff(text: str) -> Text:
    """``text``, a patch, styled line by line; each line :func:`terminal_safe` (a line ending in a
    carriage return shows it: ``\\r``)."""
    out = Text()
    for line in terminal_safe(text).splitlines(keepends=True):  # only "\n" is left to split at
        if line.startswith(("+++", "---", "diff --git", "index ", "new file", "deleted file")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        else:
            style = ""
        out.append(line, style=style)
    return out
