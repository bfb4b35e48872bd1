"""``clover-agent run "INSTRUCTION"``: one-shot and headless, for harnesses (see docs/run.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from clover_agent.ci.oneshot import RUN_SANDBOXES, RunRequest, run_once
from clover_agent.cli.options import add_backend_arguments, add_budget_arguments, backend_options
from clover_agent.settings import Settings

EXIT_CODES = """\
exit codes (as the CI bot's):
  0  the agent called finish (its summary is a claim: nothing was verified; result.json's verdict is null)
  1  the agent gave up, or the change could not be written back into DIR
  2  usage: bad arguments, DIR not a folder, an empty instruction, --out not an empty folder outside DIR
  3  model backend unavailable      4  sandbox unavailable
  6  budget exhausted: --max-steps, --max-time or --max-tokens ran out (the change so far is kept)
  7  the agent stopped: stuck, repeated format errors, a replay run out
  130 interrupted
OUT gets patch.diff (the change, against the folder as it was at the start), result.json and
trajectory.jsonl; stdout gets one summary line, the log goes to stderr."""


def _run(args: argparse.Namespace) -> int:
    request = RunRequest(
        instruction=args.instruction,
        folder=Path(args.dir),
        backend=backend_options(args),
        output_dir=Path(args.out) if args.out else None,
        sandbox=args.sandbox,
        image=args.image,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
    )
    settings = Settings.load()
    previous = signal.signal(signal.SIGTERM, _terminated)  # a harness's timeout: end as an interrupt
    try:
        return run_once(request, settings, out=sys.stdout, err=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="one-shot, headless: an instruction done in a folder, the diff and a JSON result written",
        description="Do INSTRUCTION in DIR with no questions asked (policy ci), then write OUT/patch.diff,\n"
        "result.json and trajectory.jsonl. DIR need not be a git repository. With --sandbox docker\n"
        "or local the agent works on a copy and its change is written back into DIR without asking\n"
        "(never into .git or .clover, never outside DIR). --sandbox none: the agent works in DIR\n"
        "itself with no isolation, for use inside a container you throw away (a harness's).\n"
        "See docs/run.md.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("instruction", metavar="INSTRUCTION", help="what to do, as text")
    p.add_argument(
        "--dir", default=".", metavar="DIR", help="the folder to work on (default: the current one)"
    )
    p.add_argument(
        "--out",
        metavar="OUT",
        help="where the files go (an empty or new folder outside DIR; default DIR/.clover/runs/ID/, or a "
        "temporary folder when DIR is not writable)",
    )
    add_backend_arguments(p)
    p.add_argument(
        "--sandbox",
        choices=RUN_SANDBOXES,
        default="docker",
        help="docker: a copy in a container without network (the default); local: a copy on this machine, "
        "no isolation; none: DIR itself, no isolation (only inside a throwaway container)",
    )
    p.add_argument("--image", metavar="IMG", help="Docker image for the sandbox")
    add_budget_arguments(p)
    p.set_defaults(func=_run)
