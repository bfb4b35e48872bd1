"""The end of ``clover-agent fix`` at the user's side: the summary, and handing the patch back.

At a terminal (and without ``--yes`` / ``--dry-run``) the person sees the diff first, coloured,
through a pager when it is longer than the screen (``PAGER``, default ``less -R -F -X``), then
chooses: apply all of it, choose file by file, show the diff again, or not apply it. The files
chosen are applied together by :func:`clover_agent.fix.patches.apply_patch` (``git apply
--check`` first, never over uncommitted changes to a file it touches). Whatever happens, also
Ctrl-C or Ctrl-D at the question, the way to apply it later is said, and ``summary.json``'s
``hand_back`` records it.
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
from typing import Any

from rich.console import Console
from rich.text import Text

from clover_agent.errors import CloverError, ExitCode
from clover_agent.fix.figures import RunFigures, duration
from clover_agent.fix.patches import PatchNotApplied, apply_command, apply_patch
from clover_agent.fix.task import FixReport

DEFAULT_PAGER = "less -R -F -X"
#: The patch of the files chosen one by one, beside the whole one in the run folder.
CHOSEN_PATCH_FILE = "patch.chosen.diff"

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
    return text


def print_summary(report: FixReport, figures: RunFigures, console: Console) -> None:
    """The verdict, the tests before and after, what changed, the run's figures and its files. A run
    that did not succeed is named here by its exit code; its reason is said once, by the command."""

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    if report.fixed:
        status, style = f"FIXED — {report.message}", "bold green"
    elif report.exit_code == ExitCode.NOTHING_TO_FIX:
        status, style = "NOTHING TO FIX (exit 5)", "bold yellow"
    else:
        status, style = f"NOT FIXED (exit {int(report.exit_code)})", "bold red"
    console.print()
    console.print(Text(f"clover-agent fix: {status}", style=style))
    lines = []
    if report.selection:
        lines.append(f"  target      {report.selection}")
    lines.append(
        f"  before      target: {_counts(report.target_before)}; suite: {_counts(report.suite_before)}"
    )
    if report.target_after is not None:
        lines.append(
            f"  after       target: {_counts(report.target_after)}; suite: {_counts(report.suite_after)}"
        )
    if report.regressions:
        lines.append(f"  broke       {', '.join(report.regressions)}")
    if report.agent is not None:
        lines.append(f"  changed     {', '.join(report.files_changed) or 'nothing'}")
        if report.test_files_changed:
            lines.append(
                f"  WARNING     test files changed: {', '.join(report.test_files_changed)} — review them"
            )
        note = " (replayed turns, not a model)" if report.backend.startswith("replay") else ""
        lines.append(
            f"  agent       {report.agent.outcome}; {figures.final()}; backend {report.backend}{note}"
        )
        lines.append(f"  patch       {rel(report.patch_path)}")
    lines.append(f"  trajectory  {rel(report.trajectory_path)}")
    lines.append(f"  time        {duration(report.elapsed_s)}")
    console.print("\n".join(lines))


# -- handing the patch back --------------------------------------------------------------------------


def hand_back(
    report: FixReport,
    repo: Path,
    args: argparse.Namespace,
    console: Console,
    *,
    environ: Mapping[str, str] | None = None,
    ask: Callable[[str], str] = input,
) -> int:
    """Apply the patch when the user agrees (see the module docstring), record what happened in the
    run's summary.json; the exit code of the whole command. ``ask`` reads one answer."""
    try:
        return _hand_back(report, repo, args, console, dict(environ or {}), ask)
    finally:
        report.write_summary()


def _hand_back(
    report: FixReport,
    repo: Path,
    args: argparse.Namespace,
    console: Console,
    environ: dict[str, str],
    ask: Callable[[str], str],
) -> int:
    how = shlex.join(apply_command(repo, report.patch_path))
    if args.dry_run:
        report.hand_back = "dry run"
        console.print(f"Dry run: the patch was not applied. To apply it: {how}")
        return ExitCode.OK
    sections = split_patch(report.patch_path.read_text(encoding="utf-8", errors="replace"))
    chosen = sections
    if not args.yes:
        if not sys.stdin.isatty():
            report.hand_back = "no terminal to confirm"
            console.print(
                f"No terminal to confirm, so the patch was not applied (use --yes to apply). To apply it: {how}"
            )
            return ExitCode.OK
        try:
            chosen = _choose(sections, repo, console, environ, ask)
        except EOFError:  # Ctrl-D: no
            console.print()
            chosen = []
        except KeyboardInterrupt:
            report.hand_back = "declined (interrupted)"
            raise CloverError(
                f"interrupted: the patch was not applied. To apply it later: {how}",
                exit_code=ExitCode.INTERRUPTED,
            ) from None
        if not chosen:
            report.hand_back = "declined"
            console.print(f"Not applied. To apply it later: {how}")
            return ExitCode.OK
    patch_file = report.patch_path
    if len(chosen) < len(sections):
        patch_file = report.run_dir / CHOSEN_PATCH_FILE
        patch_file.write_text("".join(s.text for s in chosen), encoding="utf-8")
    try:
        files = apply_patch(repo, patch_file)
    except PatchNotApplied as exc:
        report.hand_back = f"refused: {exc.message}"
        raise CloverError(exc.message) from None
    left = [s.path for s in sections if s not in chosen]
    report.hand_back = (
        "applied" if not left else f"applied: {', '.join(files)}; not applied: {', '.join(left)}"
    )
    console.print(Text(f"Applied to {repo}: {', '.join(files)}", style="green"))
    if left:
        console.print(f"Not applied: {', '.join(left)}. The whole patch is {report.patch_path} ({how}).")
    return ExitCode.OK


def _choose(
    sections: list[FilePatch],
    repo: Path,
    console: Console,
    environ: dict[str, str],
    ask: Callable[[str], str],
) -> list[FilePatch]:
    """Show the diff and ask; the sections to apply (none: not applied)."""
    show_diff(sections, console, environ)
    files = "; ".join(f"{s.path} ({s.counts})" for s in sections)
    several = len(sections) > 1
    choices = (
        "[y] yes / [f] choose files / [d] diff again / [N] no"
        if several
        else "[y] yes / [d] diff again / [N] no"
    )
    while True:
        answer = ask(f"Apply the patch to {repo}? {files}\n{choices}: ").strip().lower()
        if answer in ("d", "diff"):
            show_diff(sections, console, environ)
        elif answer in ("y", "yes"):
            return sections
        elif several and answer in ("f", "files"):
            return [
                s
                for s in sections
                if ask(f"  apply {s.path} ({s.counts})? [y/N] ").strip().lower() in ("y", "yes")
            ]
        else:
            return []


def show_diff(sections: list[FilePatch], console: Console, environ: dict[str, str]) -> None:
    """The diff, coloured at a colour terminal, through the pager when longer than the screen."""
    text = "".join(s.text for s in sections)
    if len(text.splitlines()) + 4 <= console.height:
        console.print(colored_diff(text), end="")
        return
    rendered = io.StringIO()
    Console(file=rendered, force_terminal=console.color_system is not None, color_system=console.color_system,
            width=console.width, markup=False, highlight=False, soft_wrap=True).print(colored_diff(text), end="")  # fmt: skip
    pager = shlex.split(environ.get("PAGER") or DEFAULT_PAGER)
    try:
        subprocess.run(pager, input=rendered.getvalue(), text=True, check=False)
    except OSError:  # no such pager: print it as it is
        console.print(colored_diff(text), end="")


def colored_diff(text: str) -> Text:
    out = Text()
    for line in text.splitlines(keepends=True):
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
