"""``clover-agent ci``: the headless CI bot (see :mod:`clover_agent.ci` and docs/ci.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from clover_agent.ci import CiRequest, run_ci
from clover_agent.cli.options import add_backend_arguments, add_budget_arguments, backend_options
from clover_agent.errors import UsageError
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
  130 interrupted (SIGINT or SIGTERM, e.g. a cancelled job)
The output folder always gets result.json and summary.md; patch.diff and trajectory.jsonl once the
run started. The working tree is never changed: apply patch.diff with `git apply`."""


def _ci(args: argparse.Namespace) -> int:
    if args.task is not None:
        task, source = args.task, "--task"
    else:
        task, source = _read_task_file(args.task_file), f"--task-file {args.task_file}"
    request = CiRequest(
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
        json_events=args.json_events,
        trust_repo=args.trust_repo,
    )
    settings = Settings.load()
    previous = signal.signal(signal.SIGTERM, _terminated)  # a cancelled CI job: end as an interrupt
    try:
        return run_ci(request, settings, out=sys.stdout, err=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ci",
        help="headless bot for CI: a task in, a verified patch and a JSON report out",
        description="Work on TASK (free text, e.g. an issue; treated as untrusted data) in a Docker\n"
        "sandbox without network, with policy ci: reproduce the failing tests (--target, or the\n"
        "suite's failures; with none failing, the patch must add a test that shows the change),\n"
        "repair, verify, and write OUT/patch.diff, result.json, trajectory.jsonl and summary.md.\n"
        "The working tree is left untouched. See docs/ci.md.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        "--trust-repo",
        action="store_true",
        help="use the repository's .clover/config.toml whole: its set-up commands (still without the "
        "network), image, packages and wheels. Without it those are ignored (a pull request could "
        "change them); only for workflows that check out code you trust (see docs/ci.md)",
    )
    add_budget_arguments(p)
    p.add_argument(
        "--json-events",
        action="store_true",
        help="JSON Lines events on stdout (version 1, see docs/ci.md); human logs go to stderr",
    )
    p.set_defaults(func=_ci)
