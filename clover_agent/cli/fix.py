"""``clover-agent fix TARGET``: reproduce a failing test, repair it, verify, hand back a patch."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.policy import DEFAULT_PRESET, PRESETS, preset
from clover_agent.cli.handback import hand_back, print_summary
from clover_agent.cli.options import (
    BUDGET_DEFAULTS,
    DEFAULT_SANDBOX,
    add_backend_arguments,
    add_budget_arguments,
    add_sandbox_arguments,
    add_trust_argument,
    apply_launch_record,
    backend_options,
    check_repo,
    launch_record,
    positive,
    record_key,
    repo_config_of,
    sandbox_kind,
    sandbox_spec_of,
)
from clover_agent.errors import CloverError, ExitCode, UsageError
from clover_agent.events import (
    Done,
    Event,
    EventBus,
    ModelResponded,
    PromptRefused,
    RunStarted,
    TaskResumed,
    TaskStarted,
)
from clover_agent.fix import decision
from clover_agent.fix.console import ConsoleRenderer, ProgressText, TerminalApprover, make_console
from clover_agent.fix.progress import RunFigures
from clover_agent.fix.regression import DEFAULT_SCOPE, REGRESSION_SCOPES
from clover_agent.fix.request import FixRequest
from clover_agent.fix.resume import StoppedRun, load_stopped_run
from clover_agent.fix.runs import locate_run
from clover_agent.fix.workflow import run_fix, verify_part
from clover_agent.handback.hostgit import git as host_git
from clover_agent.handback.judging import Checked
from clover_agent.handback.stock import PatchSet
from clover_agent.handback.verdict import Verdict
from clover_agent.launch import backend_factory, check_backend_options, hooks_of, mcp_servers, probe_backend
from clover_agent.safe_text import shown_names, terminal_safe
from clover_agent.session.assembly import SessionConfig
from clover_agent.settings import Settings
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S

EXIT_CODES = """\
exit codes:
  0  fixed: the target passes and no test that passed before fails (patch kept, applied if accepted)
  1  not fixed: the agent finished but a target test fails, is skipped or is gone, other tests broke,
     or the target's tests were weakened; or nothing of the patch could be applied (each file
     changed since the run began in a way that cannot be merged: removed, binary, ...)
  2  usage: bad arguments, or TARGET selects no tests
  3  model unavailable: no GPU / weights for the engine, server unreachable
  4  sandbox unavailable: Docker missing or not running, image missing (try --sandbox local)
  5  nothing to fix: the target tests already pass
  6  budget exhausted: --max-steps, --max-time or --max-tokens ran out
  7  agent error: stuck repeating itself, replay file exhausted, the prompt too long for the
     model's context window (before any model call: a model with a larger window is needed)
  8  fixed, suite unverified: the target passes, but the rest of the suite could not be checked
     (it timed out, could not be collected or run, or its tests erred for environment reasons)
  9  needs review: the target passes, but a check of how it passes found something to look at
     (code that reaches for the test runner, a wrong canary test, a test that fails without
     pytest, a forged result; listed in summary.json's review): --yes never applies it
  130 interrupted (Ctrl-C); a Ctrl-C while the patch is applied says whether your tree is
     unchanged or fully patched (never half)
Every run keeps its trajectory, patch and summary under <repo>/.clover/runs/<id>/;
summary.json's hand_back says what became of the patch (applied, dry run, declined, refused).

resuming: a run whose agent stopped on a budget (6), an interrupt (130), an unavailable model
(3), a lost sandbox (4) or being stuck (7) continues with `fix --resume RUN_ID` (or `--resume last`, or
the run's folder): a fresh sandbox gets the workspace as the run left it, the agent continues the
recorded conversation with a fresh budget, the same trajectory grows, and the result is verified and
handed back as usual. The run recorded how it was started (backend, model, image, wheels, budgets,
policy, suite and test timeouts, regression scope): options given now replace those, except the regression
scope its baseline was measured with; TARGET may be left out (it is the recorded one). Only runs
your clover-agent wrote are resumed (their records are signed with a key in your CLOVER_STATE
folder), and a run outside Docker continues only with --sandbox given again. The printed command
also repeats --sandbox local, --trust-repo, --yes, --dry-run and --keep-stream when they were given.

`clover-agent runs` lists the runs of a repository; `clover-agent runs show RUN_ID` shows one."""


def _warn_about_local_changes(repo: Path, console: Console) -> None:
    """Before any work: say which files have uncommitted changes (the sandbox starts from them, and
    a patch touching them keeps them: edits made later are merged)."""
    # The host's safe git: a repository's hooks, fsmonitor or filters run nothing here.
    status = host_git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=no", "--", ".", check=False)
    entries = status.stdout.decode("utf-8", "surrogateescape").split("\0")
    dirty = [entry[3:] for entry in entries if len(entry) > 3]
    if dirty:
        shown = shown_names(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
        console.print(
            Text(
                f"note: uncommitted changes in {shown}. The agent starts from them (the sandbox copies your "
                "tree as it is), so the patch keeps them; what you change in those files while it works is "
                "merged with its change when the patch is applied.",
                style="yellow",
            )
        )


def _resolve_resume(args: argparse.Namespace, settings: Settings) -> tuple[Path, StoppedRun, list[str]]:
    """The repository and the stopped run ``--resume`` names (an id or ``last`` under ``--repo``,
    or the path of a run folder, whose repository is the one it lies in), signed by this user's
    clover-agent, with ``args`` filled in from how the run was started (the flags taken from it
    are returned). A run that ran outside Docker continues only with ``--sandbox`` given now."""
    repo, run_dir = locate_run(args.resume, None if args.repo == "." else Path(args.repo))
    args.repo = str(repo)
    repo = check_repo(args)
    stopped = load_stopped_run(run_dir, record_key(settings, repo), args.target)
    kind = stopped.launch.get("sandbox", DEFAULT_SANDBOX)
    if args.sandbox is None and kind != DEFAULT_SANDBOX:
        raise UsageError(
            f"run {stopped.run_id} ran in the {kind} sandbox, without isolation; a resumed run runs that way "
            f"only when the command line says so: add --sandbox {kind} (or --sandbox {DEFAULT_SANDBOX})"
        )
    recorded = stopped.launch.get("regression")
    if args.regression is not None and recorded is not None and args.regression != recorded:
        # The after-runs repeat the baseline's tests: another scope would compare other tests.
        raise UsageError(
            f"--regression {args.regression}: run {stopped.run_id} measured its regression baseline "
            f"with --regression {recorded}, and a resumed run is checked against that baseline; leave "
            "--regression out, or start a new run"
        )
    return repo, stopped, apply_launch_record(args, stopped.launch, stopped.replay_turns_used)


#: The budgets and policy when neither the command line nor a resumed run's record gives them.
DEFAULTS = {**BUDGET_DEFAULTS, "policy": DEFAULT_PRESET}


def _fix(args: argparse.Namespace) -> int:
    if args.target is None and args.resume is None:
        raise UsageError("fix needs a TARGET (a test, test file, keyword or description), or --resume RUN_ID")
    if args.plan and args.resume is not None:
        raise UsageError("--plan starts a new run with a plan; a resumed run goes on with what it was doing")
    settings = Settings.load()  # once per command; everything below gets its values passed in
    console = make_console(environ=settings.environment)
    errors = make_console(sys.stderr, environ=settings.environment)
    if args.resume is not None:
        repo, stopped, taken = _resolve_resume(args, settings)
    else:
        repo, stopped, taken = check_repo(args), None, []
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    configured = repo_config_of(
        args,
        settings,
        repo,
        ask=sys.stdin.isatty(),
        say=lambda text: errors.print(Text(text, style="yellow")),
    )
    # Resolved here, so the run records what it used (see launch_record).
    args.regression = args.regression or configured.regression or DEFAULT_SCOPE
    args.suite_timeout = args.suite_timeout or configured.suite_timeout or DEFAULT_TIMEOUT_S
    # None: a fifth of the suite timeout (not recorded, so a resumption's new --suite-timeout counts)
    args.test_timeout = args.test_timeout or configured.test_timeout
    figures = RunFigures()
    renderer = ConsoleRenderer(console, figures=figures, verbose=args.verbose, quiet=args.quiet)
    options = backend_options(args, progress=ProgressText(renderer))
    options = check_backend_options(options, settings)  # with the model the settings chose
    asyncio.run(probe_backend(options, settings))  # a server that cannot be reached: before any work
    if taken and stopped is not None and not args.quiet:
        console.print(
            Text(
                terminal_safe(
                    f"resuming with the options run {stopped.run_id} was started with: {' '.join(taken)}"
                ),
                style="dim",
            )
        )
    if not args.quiet:
        _warn_about_local_changes(repo, errors)
    # At a terminal a person answers what the policy asks about; elsewhere (and with ci) no one can.
    approvals = Approvals() if sys.stdin.isatty() and args.policy != "ci" else None
    session = SessionConfig(
        repo=repo,
        make_backend=backend_factory(options, settings),
        spec=sandbox_spec_of(args, settings, repo, configured),
        sandbox_kind=sandbox_kind(args),
        policy=preset(args.policy),
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
        record_key=record_key(settings, repo),
        mcp_servers=mcp_servers(settings, repo, configured),
        hooks=hooks_of(settings, repo, configured),
    )
    request = FixRequest(
        target=stopped.target if stopped else args.target,
        session=session,
        regression=args.regression,
        approvals=approvals,
        suite_timeout_s=args.suite_timeout,
        test_timeout_s=args.test_timeout,
        launch=launch_record(args, options),
        keep_stream=args.keep_stream,
        plan=("go" if args.yes else "show") if args.plan and stopped is None else "",
    )
    if stopped is not None:
        figures.steps_before = stopped.state.steps
    bus = EventBus()
    bus.subscribe(figures)
    bus.subscribe(renderer)
    if approvals is not None:
        bus.subscribe(TerminalApprover(approvals))
    progress = _RunProgress(_unrecorded_flags(args))
    bus.subscribe(progress)
    try:
        report = asyncio.run(run_fix(request, bus, resume=stopped))
    except KeyboardInterrupt:
        hint = progress.resume_hint(repo)
        raise CloverError(
            f"interrupted{'; ' + hint if hint else ''}", exit_code=ExitCode.INTERRUPTED
        ) from None
    finally:
        renderer.close()
    if report.agent is not None and report.agent.outcome == "planned":  # --plan without --yes
        if report.stock is not None:
            report.stock.discard()
        console.print(
            Text(
                "The plan is above; nothing was changed. To have a plan carried out, run the command "
                "again with --plan --yes: the agent plans again, then goes on with its plan.",
                style="bold",
            )
        )
        return int(ExitCode.OK)
    print_summary(report, figures, console)
    if not (report.fixed or report.verdict == Verdict.NEEDS_REVIEW):  # needs review: a person may apply it
        hint = progress.resume_hint(repo)
        if report.stock is not None:
            report.stock.discard()  # the verdict is already the trajectory's last line
        raise CloverError(report.message + (f"\n{hint}" if hint else ""), exit_code=report.exit_code)

    def reverify(part: PatchSet) -> Checked:  # the run's renderer is closed: this says its own lines
        return asyncio.run(verify_part(report, part, EventBus()))

    veto = decision.hook_veto(
        session.hooks,
        report,
        repo,
        environ=settings.environment,
        say=lambda text: console.print(Text(text, style="yellow")),
    )
    return hand_back(report, repo, args, console, environ=settings.environment, reverify=reverify, veto=veto)


def _unrecorded_flags(args: argparse.Namespace) -> list[str]:
    """The flags of this command that a resumption does not take from its record (what becomes of
    the patch, whether the stream is kept, a sandbox without isolation, the trust given to the
    repository's file): the printed resume command repeats them, so it does what this one did."""
    chosen = {
        "--yes": args.yes,
        "--dry-run": args.dry_run,
        "--conflict-markers": args.conflict_markers,
        "--keep-stream": args.keep_stream,
        "--trust-repo": args.trust_repo,
    }
    local = [] if sandbox_kind(args) == DEFAULT_SANDBOX else [f"--sandbox {sandbox_kind(args)}"]
    return [*local, *(flag for flag, given in chosen.items() if given)]


class _RunProgress:
    """How far a fix run got, from its events: whether it can be resumed, and under which id."""

    def __init__(self, flags: list[str]) -> None:
        self.flags = flags  # added to the resume command
        self.run_id: str | None = None
        self.agent_started = False
        self.agent_outcome: str | None = None
        self.refused = False  # the last prompt did not fit the model's window (and was not sent)

    def __call__(self, event: Event) -> None:
        if isinstance(event, (TaskStarted, TaskResumed)):
            self.run_id = event.run_id
        # A resumed run reached its agent before, even if this segment stops before it starts.
        if isinstance(event, (TaskResumed, RunStarted)):
            self.agent_started = True
        elif isinstance(event, Done):
            self.agent_outcome = event.outcome
        elif isinstance(event, PromptRefused | ModelResponded):
            self.refused = isinstance(event, PromptRefused)

    def resume_hint(self, repo: Path) -> str | None:
        """How to continue the run, when it stopped in its agent (``fix --resume`` refuses the rest).
        The run records how it was started, so the command needs only what it does not record."""
        if self.run_id is None or not self.agent_started or self.agent_outcome == "submitted":
            return None
        command = ["clover-agent", "fix", "--resume", self.run_id, "--repo", str(repo)]
        command += [word for flag in self.flags for word in flag.split(" ")]
        if self.refused and self.agent_outcome == "error":  # the same model would refuse it again
            return (
                "to continue it with a model of a larger context window: "
                f"{shlex.join(command)} --model DIR (or --base-url URL)"
            )
        return f"continue it with: {shlex.join(command)}"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fix",
        help="make a failing test pass and hand back a patch",
        description="Reproduce the failure of TARGET in a sandbox, repair it with the agent, verify\n"
        "(the target passes, nothing that passed before fails), and keep the patch under\n"
        ".clover/runs/<id>/. TARGET is a test node id, a test file, a -k keyword expression,\n"
        'or free text matched against test names; free text naming only a failure ("the failing\n'
        'test", "fix the bug") means the tests failing now in the suite.',
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
        "`last` for the newest, or the run's folder; it goes on with the backend, budgets, policy, "
        "suite timeout and regression scope it was started with, unless options given now say "
        "otherwise (the regression scope cannot change: the baseline was measured with it); the "
        "sandbox is docker unless --sandbox says otherwise now",
    )
    p.add_argument("--repo", default=".", help="repository to work on (default: current folder)")
    add_backend_arguments(p)
    add_sandbox_arguments(p)
    add_trust_argument(p)
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
    p.add_argument(
        "--plan",
        action="store_true",
        help="look first: the agent only reads, searches and runs tests, then proposes a plan (its steps, "
        "the files it will change, how it will be checked), which is printed; the run stops there with "
        "nothing changed, unless --yes: then the plan is approved and carried out, and the patch applied",
    )
    p.add_argument(
        "--conflict-markers",
        action="store_true",
        help="where the fix overlaps an edit you made since the run started, write both between conflict "
        "markers (default: keep yours and name the overlap)",
    )
    add_budget_arguments(p, recorded=True)  # None when not given: a resumed run's record fills in
    p.add_argument(
        "--policy",
        choices=tuple(PRESETS),
        help=f"which tool calls may run (default {DEFAULT_PRESET}): read-only: view, search and run tests, "
        "no edits or shell; workspace: anything inside /workspace, asking you first for network or "
        "install commands (git push, curl, wget, pip/npm install, sudo; refused without a terminal: "
        "answer y once, a always (the question says what that allows), n, or type what to do instead); "
        "ci: the same, those commands refused",
    )
    p.add_argument(
        "--suite-timeout",
        type=positive(float),
        metavar="S",
        help="seconds each run of the whole suite may take (default: [fix] suite_timeout in "
        ".clover/config.toml, else 600); a suite that timed out leaves the run unverified (exit 8)",
    )
    p.add_argument(
        "--test-timeout",
        type=positive(float),
        metavar="S",
        help="seconds each test may take in any run before it fails alone, 'timed out after S s', while "
        "the rest runs (default: [fix] test_timeout in .clover/config.toml, else a fifth of the suite timeout)",
    )
    talk = p.add_mutually_exclusive_group()
    talk.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the model's thinking whole (default: one line a turn)",
    )
    talk.add_argument(
        "-q", "--quiet", action="store_true", help="for scripts: only the summary and errors, no progress"
    )
    p.add_argument(
        "--keep-stream",
        action="store_true",
        help="also keep the streamed text and the engine's provisional blocks in the trajectory (for "
        "analysis; the trajectory holds each turn whole anyway)",
    )
    p.set_defaults(func=_fix)
