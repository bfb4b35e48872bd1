"""``clover-agent ci``: the headless CI bot (see :mod:`clover_agent.ci` and docs/ci.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from clover_agent.ci import CiRequest, run_ci
from clover_agent.ci.events import EVENTS_VERSION, VERSIONS
from clover_agent.ci.run import report_early_error
from clover_agent.cli.options import add_backend_arguments, add_budget_arguments, backend_options
from clover_agent.errors import RUN_ERRORS, ExitCode, UsageError
from clover_agent.safe_text import terminal_safe
from clover_agent.settings import Settings

#: Bytes of a --task-file read (the task is cut far shorter after sanitising; this bounds memory).
MAX_TASK_FILE_BYTES = 4 * 1024 * 1024

EXIT_CODES = """\
exit codes (the same as fix's where the meanings match):
  0  fixed: the target passes and no test that passed before fails (with no failing test: a test
     the patch adds fails without the change and passes with it); patch.diff is verified
  1  not fixed: the tests still fail, others broke, no test shows the change, or the agent gave up
     or got stuck; patch.diff holds the best partial patch, marked "partial" in result.json
  2  usage or configuration: bad arguments, --task missing or empty, a repository with uncommitted
     changes or stored credentials, an output folder that is not the bot's, a TARGET selecting nothing
  3  model backend unavailable: no GPU or weights for the engine, server unreachable
  4  sandbox unavailable: Docker missing or not running, the image missing
  5  nothing to fix: --target already passes
  6  budget exhausted: --max-steps, --max-time or --max-tokens ran out (partial patch kept)
  8  fixed, suite unverified: the target passes on the patched tree, but the rest of the suite
     could not be checked (it timed out, could not be collected, ...); patch.diff is kept
  9  needs review: the target passes, but a check of how it passes found something to look at
     (result.json's review); patch.diff is kept, marked "needs_review", never handed back
  10 blocked: a UserPromptSubmit hook kept the task from the model (no model call; result.json's
     blocked says the hook's reason)
  130 interrupted (SIGINT or SIGTERM, e.g. a cancelled job)
The output folder always gets result.json and summary.md (bad arguments included, once --output-dir
is read and is the bot's), and --json-events a last `finished` line; patch.diff and trajectory.jsonl
once the run started. The working tree is never changed: apply patch.diff with `git apply`."""


def _ci(args: argparse.Namespace) -> int:
    source = "--task" if args.task is not None else f"--task-file {args.task_file}"
    try:
        task = args.task if args.task is not None else _read_task_file(args.task_file)
        request, settings = _request(args, task, source), Settings.load()
    except RUN_ERRORS as exc:  # the run's ending all the same: result.json, the finished line
        return _early_error(exc, args.output_dir, args.repo, source, args.json_events)
    previous = signal.signal(signal.SIGTERM, _terminated)  # a cancelled CI job: end as an interrupt
    try:
        return run_ci(request, settings, out=sys.stdout, err=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _early_error(
    error: BaseException,
    output_dir: str | None,
    repo: str | None,
    source: str | None,
    json_events: int | None,
) -> int:
    return report_early_error(
        error,
        output_dir=output_dir,
        repo=repo,
        task_source=source,
        json_events=json_events or 0,
        out=sys.stdout,
        err=sys.stderr,
    )


def _request(args: argparse.Namespace, task: str, source: str) -> CiRequest:
    return CiRequest(
        task=task,
        task_source=source,
        repo=Path(args.repo),
        output_dir=Path(args.output_dir),
        backend=backend_options(args),
        target=args.target,
        image=args.image,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
        json_events=args.json_events or 0,
        trust_repo=args.trust_repo,
        sandbox=args.sandbox,
    )


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _read_task_file(name: str) -> str:
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_TASK_FILE_BYTES)
        else:
            with open(name, "rb") as f:
                data = f.read(MAX_TASK_FILE_BYTES)
    except OSError as exc:
        raise UsageError(f"--task-file {name}: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


class _CiParser(argparse.ArgumentParser):
    """``ci``'s parser: a command line it cannot read ends as every run does (docs/ci.md): argparse's
    message and usage on stderr, then, with what can be read of the arguments, result.json and
    summary.md in --output-dir and with --json-events the ``finished`` line; exit 2."""

    arguments: Sequence[str] = ()

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.arguments = list(sys.argv[1:] if args is None else args)
        if self.arguments[:1] == ["init"]:  # `ci init`: a command of its own, not a run
            return _init_parser().parse_known_args(self.arguments[1:], namespace)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # the top parser would say so, without ending as a run
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {terminal_safe(message)}\n")
        known = _lenient(self.arguments)
        source = "--task" if known.task is not None else known.task_file and f"--task-file {known.task_file}"
        code = _early_error(
            UsageError(f"bad arguments: {message}"), known.output_dir, known.repo, source, known.json_events
        )
        sys.exit(code if code != ExitCode.OK else ExitCode.USAGE)


def _lenient(arguments: Sequence[str]) -> argparse.Namespace:
    """What of ``arguments`` the ending needs, read whatever else they hold (the last of each wins;
    a value missing or unreadable is None)."""
    reader = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("--output-dir", "--repo", "--task", "--task-file"):
        reader.add_argument(name)
    reader.add_argument("--json-events", nargs="?", const=str(EVENTS_VERSION))
    try:
        known = reader.parse_known_args(list(arguments))[0]
        known.json_events = _version(known.json_events)
        return known
    except (argparse.ArgumentError, SystemExit):  # an option's value missing: read the flag alone
        given = [a for a in arguments if a == "--json-events" or a.startswith("--json-events=")]
        return argparse.Namespace(
            output_dir=None,
            repo=None,
            task=None,
            task_file=None,
            json_events=EVENTS_VERSION if given else None,
        )


def _version(value: str | None) -> int | None:
    """The events' version a --json-events value asks for (one not known: the current one)."""
    if value is None:
        return None
    return int(value) if value in {str(v) for v in VERSIONS} else EVENTS_VERSION


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ci",
        help="headless bot for CI: a task in, a verified patch and a JSON report out",
        description="Work on TASK (free text, e.g. an issue; treated as untrusted data) in a Docker\n"
        "sandbox without network, with policy ci: reproduce the failing tests (--target, or the\n"
        "suite's failures; with none failing, the patch must add a test that shows the change),\n"
        "repair, verify, and write OUT/patch.diff, result.json, trajectory.jsonl and summary.md.\n"
        "The working tree is left untouched. See docs/ci.md.\n\n"
        "`clover-agent ci init` writes the GitHub workflows that run it into a repository (ci init --help).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.__class__ = _CiParser  # add_parser makes the subparsers' class; this one ends bad arguments as a run
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--task", metavar="TEXT", help="what to do, as text")
    task.add_argument("--task-file", metavar="FILE", help="what to do, read from FILE (- for stdin)")
    p.add_argument(
        "--target", metavar="TEST", help="the tests to make pass (default: those failing in the suite)"
    )
    p.add_argument("--repo", required=True, metavar="DIR", help="the repository (a clean git work tree)")
    p.add_argument(
        "--output-dir",
        required=True,
        metavar="OUT",
        help="where the files go (empty or new, outside the work tree)",
    )
    add_backend_arguments(p)
    p.add_argument("--image", metavar="IMG", help="Docker image for the sandbox")
    p.add_argument(
        "--sandbox",
        choices=("docker", "local"),
        default="docker",
        help="where the agent's commands run (default docker; local: no isolation, to try the bot on a "
        "machine without Docker — never in CI)",
    )
    p.add_argument(
        "--trust-repo",
        action="store_true",
        help="use the repository's .clover/config.toml whole: its set-up commands (still without the "
        "network), image, packages and wheels. Without it those are ignored (a pull request could "
        "change them); only for workflows that check out code you trust (see docs/ci.md)",
    )
    add_budget_arguments(p)
    p.add_argument(
        "--json-events",
        nargs="?",
        const=EVENTS_VERSION,
        type=int,
        choices=VERSIONS,
        metavar="VERSION",
        help=f"JSON Lines events on stdout (version {EVENTS_VERSION}; `--json-events 1`: version 1's lines "
        "only; see docs/ci.md); human logs go to stderr",
    )
    p.set_defaults(func=_ci)


def _init_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clover-agent ci init",
        description="Write the bot's GitHub workflows into REPO/.github/workflows/ (on comments and labels, "
        "and on a failed CI run), the action pinned to a full commit SHA, then check them (every action "
        "pinned; actionlint and zizmor where installed). Prints the variables and the secret to set.",
    )
    p.add_argument("--repo", default=".", metavar="DIR", help="the repository (default: the current folder)")
    p.add_argument(
        "--action",
        metavar="OWNER/REPO@SHA",
        help="where the workflows take clover-agent from, pinned to the commit's full SHA (default: this "
        "clover-agent's own checkout, its GitHub origin and HEAD)",
    )
    p.add_argument(
        "--ci-workflow",
        default="CI",
        metavar="NAME",
        help="the name of your CI workflow, whose failures it takes",
    )
    p.add_argument("--force", action="store_true", help="replace workflows of those names that differ")
    p.add_argument("--dry-run", action="store_true", help="print the workflows and check them; write nothing")
    p.set_defaults(func=_ci_init)
    return p


def _ci_init(args: argparse.Namespace) -> int:
    from clover_agent.ci.init import NEXT_STEPS, action_reference, write

    repo = Path(args.repo).resolve()
    if not (repo / ".git").exists():
        raise UsageError(f"--repo {args.repo}: not a git repository (its workflows go in .github/workflows/)")
    action = action_reference(args.action)
    written = write(repo, action, ci_workflow=args.ci_workflow, force=args.force, dry_run=args.dry_run)
    for path, text in written.files.items():
        where = path.relative_to(repo)
        if args.dry_run:
            print(f"--- {where} (not written: --dry-run)\n{text}")
        else:
            print(f"wrote {where}")
    checks = " and ".join(written.checked_with) or "no linter installed (actionlint, zizmor)"
    print(f"uses {action}; every action pinned to a full commit SHA; checked with {checks}: no findings")
    if not args.dry_run:
        print(NEXT_STEPS)
    return 0
