"""``clover-agent fix TARGET``: reproduce a failing test, repair it, verify, hand back a patch."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.policy import DEFAULT_PRESET, PRESETS, preset
from clover_agent.cli.options import (
    add_backend_arguments,
    add_budget_arguments,
    add_sandbox_arguments,
    backend_options,
    check_repo,
    positive,
    sandbox_spec_of,
)
from clover_agent.errors import CloverError, ExitCode, UsageError
from clover_agent.events import Done, Event, EventBus, RunStarted, TaskResumed, TaskStarted
from clover_agent.fix.console import ConsoleRenderer, TerminalApprover
from clover_agent.fix.handback import ASK, DRY_RUN, YES, hand_back, record_outcome
from clover_agent.fix.regression import DEFAULT_SCOPE, REGRESSION_SCOPES
from clover_agent.fix.resume import StoppedRun, load_stopped_run
from clover_agent.fix.runs import locate_run
from clover_agent.fix.task import FixReport, FixRequest, run_fix
from clover_agent.fix.verdict import FIXED, FIXED_UNVERIFIED, TESTS_WEAKENED
from clover_agent.launch import backend_factory, check_backend_options
from clover_agent.settings import Settings, repo_settings
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S

EXIT_CODES = """\
exit codes:
  0  fixed: the target passes and no test that passed before fails (patch kept, applied if accepted)
  1  not fixed: the agent finished but a target test fails, is skipped or is gone, other tests broke,
     or the target's tests were weakened; or the patch could not be applied (uncommitted changes
     of yours to its files, files changed since the run began)
  2  usage: bad arguments, or TARGET selects no tests
  3  model unavailable: no GPU / weights for the engine, server unreachable
  4  sandbox unavailable: Docker missing or not running, image missing (try --sandbox local)
  5  nothing to fix: the target tests already pass
  6  budget exhausted: --max-steps, --max-time or --max-tokens ran out
  7  agent error: stuck repeating itself, replay file exhausted
  8  fixed, suite unverified: the target passes, but the rest of the suite could not be checked
     (it timed out, could not be collected or run, or its tests erred for environment reasons)
  130 interrupted (Ctrl-C); a Ctrl-C while the patch is applied says whether your tree is
     unchanged or fully patched (never half)
Every run keeps its trajectory, patch and summary under <repo>/.clover/runs/<id>/;
summary.json's hand_back says what became of the patch (applied, dry run, declined, refused).

resuming: a run whose agent stopped on a budget (6), an interrupt (130), an unavailable model
(3), a lost sandbox (4) or being stuck (7) continues with `fix --resume RUN_ID` (or `--resume last`, or
the run's folder): a fresh sandbox gets the workspace as the run left it, the agent continues the
recorded conversation with the budgets given now, the same trajectory grows, and the result is
verified and handed back as usual. TARGET may be left out (it is the recorded one)."""


def _counts(report: Any) -> str:
    if report is None:
        return "not run"
    text = f"{report.passed} passed, {report.failed} failed"
    if report.errors:
        text += f", {report.errors} errors"
    return text


def print_summary(report: FixReport) -> None:
    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    if report.verdict == FIXED:
        status = "FIXED"
    elif report.verdict == FIXED_UNVERIFIED:
        status = "FIXED, SUITE UNVERIFIED (exit 8)"
    elif report.verdict == TESTS_WEAKENED:
        status = "TESTS WEAKENED (exit 1)"
    elif report.exit_code == ExitCode.NOTHING_TO_FIX:
        status = "NOTHING TO FIX (exit 5)"
    else:
        status = f"NOT FIXED (exit {int(report.exit_code)})"
    lines = [f"\nclover-agent fix: {status} — {report.message}"]
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
    for label, items in (
        ("still fails", report.still_failing),
        ("unverified", report.unverified),
        ("weakened", report.weakened),
    ):
        if items:
            more = f" (+{len(items) - 10})" if len(items) > 10 else ""
            lines.append(f"  {label:<11} {'; '.join(items[:10])}{more}")
    if report.agent is not None:
        stats = report.agent.stats
        notes = dict(report.patch_set.to_confirm) if report.patch_set is not None else {}
        changed = [f + (f" ({'; '.join(notes[f])})" if f in notes else "") for f in report.files_changed]
        lines.append(f"  changed     {', '.join(changed) or 'nothing'}")
        for path, why in report.left_out.items():
            lines.append(f"  left out    {path}: {why}")
        if report.test_files_changed:
            lines.append(
                f"  WARNING     test files changed: {', '.join(report.test_files_changed)} — review them"
            )
        note = " (replayed turns, not a model)" if report.backend.startswith("replay") else ""
        lines.append(
            f"  agent       {report.agent.outcome}; {stats.get('steps', 0)} steps, {stats.get('tokens', 0)} tokens, "
            f"{stats.get('elapsed_s', 0):.1f} s; backend {report.backend}{note}"
        )
        lines.append(f"  patch       {rel(report.patch_path)}")
    lines.append(f"  trajectory  {rel(report.trajectory_path)}")
    lines.append(f"  time        {report.elapsed_s:.1f} s")
    print("\n".join(lines), flush=True)


def _hand_back(report: FixReport, repo: Path, args: argparse.Namespace) -> int:
    """Apply the patch when the user agrees (:func:`clover_agent.fix.handback.hand_back`), record
    the command's exit code and message in the run's summary.json and trajectory, and return it
    (a CloverError for a non-zero one)."""
    mode = DRY_RUN if args.dry_run else YES if args.yes else ASK
    confirm = _confirm if mode == ASK and sys.stdin.isatty() else None
    try:
        code, message = hand_back(report, repo, mode=mode, confirm=confirm)
    except KeyboardInterrupt:  # at the question: nothing was applied
        report.hand_back = "interrupted: not applied"
        code = int(ExitCode.INTERRUPTED)
        message = "interrupted before the patch was applied: your tree is unchanged"
    record_outcome(report, code, message)
    if code != ExitCode.OK:
        raise CloverError(message or report.message, exit_code=ExitCode(code))
    return code


def _confirm(text: str) -> bool:
    try:
        answer = input(text).strip().lower()
    except EOFError:  # Ctrl-D: no
        print()
        return False
    return answer in ("y", "yes")


def _resolve_resume(args: argparse.Namespace) -> tuple[Path, StoppedRun]:
    """The repository and the stopped run ``--resume`` names (an id or ``last`` under ``--repo``,
    or the path of a run folder, whose repository is the one it lies in)."""
    repo, run_dir = locate_run(args.resume, None if args.repo == "." else Path(args.repo))
    args.repo = str(repo)
    return check_repo(args), load_stopped_run(run_dir, args.target)


def _fix(args: argparse.Namespace) -> int:
    if args.target is None and args.resume is None:
        raise UsageError("fix needs a TARGET (a test, test file, keyword or description), or --resume RUN_ID")
    settings = Settings.load()  # once per command; everything below gets its values passed in
    options = backend_options(args)
    check_backend_options(options, settings)
    if args.resume is not None:
        repo, stopped = _resolve_resume(args)
    else:
        repo, stopped = check_repo(args), None
    policy = preset(args.policy)
    # At a terminal a person answers what the policy asks about; elsewhere (and with ci) no one can.
    approvals = Approvals() if sys.stdin.isatty() and args.policy != "ci" else None
    request = FixRequest(
        target=stopped.target if stopped else args.target,
        repo=repo,
        make_backend=backend_factory(options, settings),
        sandbox=sandbox_spec_of(args, settings, repo),
        sandbox_kind=args.sandbox,
        regression=args.regression or repo_settings(repo).regression or DEFAULT_SCOPE,
        policy=policy,
        approvals=approvals,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
        suite_timeout_s=args.suite_timeout or repo_settings(repo).suite_timeout or DEFAULT_TIMEOUT_S,
    )
    bus = EventBus()
    bus.subscribe(ConsoleRenderer(show_reasoning=args.verbose))
    if approvals is not None:
        bus.subscribe(TerminalApprover(approvals))
    progress = _RunProgress()
    bus.subscribe(progress)
    try:
        report = asyncio.run(run_fix(request, bus, resume=stopped))
    except KeyboardInterrupt:
        hint = progress.resume_hint(repo)
        raise CloverError(
            f"interrupted{'; ' + hint if hint else ''}", exit_code=ExitCode.INTERRUPTED
        ) from None
    print_summary(report)
    if not report.fixed:
        hint = progress.resume_hint(repo)
        if report.stock is not None:
            report.stock.discard()  # the verdict is already the trajectory's last line
        raise CloverError(report.message + (f"\n{hint}" if hint else ""), exit_code=report.exit_code)
    return _hand_back(report, repo, args)


class _RunProgress:
    """How far a fix run got, from its events: whether it can be resumed, and under which id."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.agent_started = False
        self.agent_outcome: str | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, (TaskStarted, TaskResumed)):
            self.run_id = event.run_id
        # A resumed run reached its agent before, even if this segment stops before it starts.
        if isinstance(event, (TaskResumed, RunStarted)):
            self.agent_started = True
        elif isinstance(event, Done):
            self.agent_outcome = event.outcome

    def resume_hint(self, repo: Path) -> str | None:
        """How to continue the run, when it stopped in its agent (``fix --resume`` refuses the rest)."""
        if self.run_id is None or not self.agent_started or self.agent_outcome == "submitted":
            return None
        return f"continue it with: clover-agent fix --resume {self.run_id} --repo {shlex.quote(str(repo))}"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fix",
        help="make a failing test pass and hand back a patch",
        description="Reproduce the failure of TARGET in a sandbox, repair it with the agent, verify\n"
        "(the target passes, nothing that passed before fails), and keep the patch under\n"
        ".clover/runs/<id>/. TARGET is a test node id, a test file, a -k keyword expression,\n"
        "or free text matched against test names.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="?",
        help="test node id, test file, keyword, or a free-text description (optional with --resume)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue a stopped run (budget, interrupt, outage): its id under <repo>/.clover/runs, "
        "`last` for the newest, or the run's folder; backend, sandbox and budget options apply anew",
    )
    p.add_argument("--repo", default=".", help="repository to work on (default: current folder)")
    add_backend_arguments(p)
    add_sandbox_arguments(p)
    p.add_argument(
        "--regression",
        choices=REGRESSION_SCOPES,
        help="what the regression runs before and after the agent cover: suite (every test; the "
        "default), related (the target's test files and those importing the same modules of the "
        "project), none (only the target); default: .clover/config.toml's [fix] regression",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--yes", action="store_true", help="apply the patch without asking")
    mode.add_argument("--dry-run", action="store_true", help="only write the patch; never apply it")
    add_budget_arguments(p)
    p.add_argument(
        "--policy",
        choices=tuple(PRESETS),
        default=DEFAULT_PRESET,
        help=f"which tool calls may run (default {DEFAULT_PRESET}): read-only: view, search and run tests, "
        "no edits or shell; workspace: anything inside /workspace, asking you first for network or "
        "install commands (git push, curl, wget, pip/npm install, sudo; refused without a terminal); "
        "ci: the same, those commands refused",
    )
    p.add_argument(
        "--suite-timeout",
        type=positive(float),
        metavar="S",
        help="seconds each run of the whole suite may take (default: [fix] suite_timeout in "
        ".clover/config.toml, else 600); a suite that timed out leaves the run unverified (exit 8)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also stream the model's reasoning")
    p.set_defaults(func=_fix)
