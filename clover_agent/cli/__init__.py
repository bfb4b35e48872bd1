"""The ``clover-agent`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module sets
``func`` on its parser, which returns an exit code. Any layer's error (:data:`RUN_ERRORS`) becomes a
clear message and the exit code :func:`exit_code_for` gives it; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from collections.abc import Sequence

from clover_agent import __version__
from clover_agent.errors import RUN_ERRORS, ExitCode, exit_code_for, message_of
from clover_agent.safe_text import terminal_safe

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "clover_agent.cli.fix",
    "clover_agent.cli.runs",
    "clover_agent.cli.ci",
    "clover_agent.cli.run",
    "clover_agent.cli.eval",
    "clover_agent.cli.tui",
    "clover_agent.cli.acp",
    "clover_agent.cli.serve",
    "clover_agent.cli.trust",
    "clover_agent.cli.doctor",
    "clover_agent.cli.model",
    "clover_agent.cli.sandbox",
    "clover_agent.cli.tool",
    "clover_agent.cli.generate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clover-agent",
        description="A coding agent on Clover-35B-A3B, a block-diffusion model you run yourself.",
        epilog="Exit codes: "
        + ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}" for code in ExitCode)
        + ". Run `clover-agent COMMAND --help` for each command and what its codes mean there.",
    )
    parser.add_argument("--version", action="version", version=f"clover-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (None: this program's arguments) and return its exit code. Run as
    the program, the process ends here when a decoding thread was abandoned (see
    :func:`_end_abandoned_decoding`)."""
    code = _run(argv)
    if argv is None:
        _end_abandoned_decoding(code)
    return code


def _end_abandoned_decoding(code: int) -> None:
    """End the process at once, after flushing its output, when an engine generation left mid-way
    (a time budget, Ctrl-C) still runs in its daemon thread: the interpreter's shutdown would tear
    torch down under it and abort ("terminate called without an active exception", exit 134)
    instead of exiting with ``code``. Everything the run keeps is on disk already."""
    if any(t.is_alive() and t.name.startswith("clover-engine") for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader gone away, a closed stream
                pass
        os._exit(code)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None and args.command is None and not list(argv if argv is not None else sys.argv[1:]):
        from clover_agent.cli.tui import is_terminal

        if is_terminal():  # plain `clover-agent` at a terminal opens the TUI; scripts get the help
            args = parser.parse_args(["tui"])
            func = args.func
    if func is None:
        default = getattr(args, "default_func", None)
        if default is None:
            parser.print_help()
            return ExitCode.USAGE
        func = default
    try:
        code = int(func(args))
        sys.stdout.flush()  # here, so that a reader gone away is caught below
        return code
    except BrokenPipeError:
        # The reader of stdout left early (`clover-agent doctor --json | head -3`): the output was
        # cut short, no more. stdout goes to /dev/null so the interpreter's last flush fails quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.FAILURE)
    except RUN_ERRORS as exc:
        print(f"clover-agent: {terminal_safe(message_of(exc))}", file=sys.stderr)
        return int(exit_code_for(exc))
    except KeyboardInterrupt:
        print("clover-agent: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
