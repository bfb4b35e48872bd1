"""``clover-agent tui`` (and plain ``clover-agent`` at a terminal): the pair-programming TUI."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from clover_agent.backends import create_backend
from clover_agent.backends.base import ModelBackend
from clover_agent.cli.fix import _check_arguments, _positive, backend_factory, require_engine
from clover_agent.errors import UsageError
from clover_agent.sandboxes import SandboxSpec
from clover_agent.settings import Settings

#: ``--resume`` given without an id: choose from a list.
PICK = "?"


def is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _backend(args: argparse.Namespace) -> Callable[[], ModelBackend]:
    """The backend factory; the engine loads without printing progress (the screen is the TUI's)."""
    if args.backend != "engine":
        return backend_factory(args)
    model = args.model or Settings.load().model_path
    return lambda: create_backend("engine", model_dir=model, progress=None)


def _tui(args: argparse.Namespace) -> int:
    if not is_terminal():
        raise UsageError("the TUI needs a terminal (stdin and stdout); for scripts use `clover-agent fix`")
    from clover_agent.tui.app import CloverApp
    from clover_agent.tui.session import SessionOptions
    from clover_agent.tui.store import list_sessions, load_session

    repo = _check_arguments(args)  # as fix checks them: the backend's options, a git repository
    if args.backend == "engine":
        require_engine(args.model)
    options = SessionOptions(
        repo=repo,
        make_backend=_backend(args),
        sandbox_kind=args.sandbox,
        spec=SandboxSpec(repo=str(repo), image=args.image),
        policy=args.policy,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
    )
    pick_from = None
    if args.resume == PICK:
        pick_from = list_sessions(repo)
        if not pick_from:
            raise UsageError(f"--resume: there are no saved sessions in {repo / '.clover' / 'sessions'}")
    elif args.resume is not None:
        options.resume = load_session(repo, args.resume)
    app = CloverApp(options, pick_from=pick_from, theme=args.theme)
    return app.run() or 0


def register(sub: argparse._SubParsersAction) -> None:
    from clover_agent.tui.driver import POLICIES

    p = sub.add_parser(
        "tui",
        help="pair-program with the agent in a terminal UI (also: plain `clover-agent` at a terminal)",
        description="A conversation with the agent over a sandboxed copy of the repository. Changes reach\n"
        "your working tree only through /apply, file by file. Sessions are saved under\n"
        ".clover/sessions/ and resumed with --resume. /help (F1) lists commands and keys.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const=PICK,
        metavar="ID",
        help="continue a saved session (without ID: pick one from a list)",
    )
    p.add_argument("--repo", default=".", help="repository to work on (default: current folder)")
    p.add_argument(
        "--backend",
        choices=("engine", "openai", "replay"),
        default="engine",
        help="engine: Clover in this process (default); openai: an OpenAI-compatible server; "
        "replay: recorded turns (tests and demos, not a model)",
    )
    p.add_argument("--model", metavar="DIR", help="Clover weights folder (engine backend)")
    p.add_argument("--base-url", metavar="URL", help="OpenAI-compatible server's API root (openai backend)")
    p.add_argument("--model-name", metavar="NAME", help="model name sent to the server (openai backend)")
    p.add_argument("--replay", metavar="FILE", help="recorded assistant turns, JSON Lines (replay backend)")
    p.add_argument(
        "--sandbox", choices=("docker", "local"), default="docker", help="where tools run (default docker)"
    )
    p.add_argument("--image", metavar="IMG", help="Docker image for the sandbox")
    p.add_argument(
        "--max-steps",
        type=_positive(int),
        default=50,
        metavar="N",
        help="model calls per request (default 50)",
    )
    p.add_argument(
        "--max-time",
        type=_positive(float),
        default=1800.0,
        metavar="S",
        help="seconds per request (default 1800)",
    )
    p.add_argument(
        "--max-tokens", type=_positive(int), metavar="N", help="tokens per request (default: no limit)"
    )
    p.add_argument(
        "--policy",
        choices=tuple(POLICIES),
        default="workspace",
        help="which calls run (default workspace): as for fix, plus ask: ask before every edit and command",
    )
    p.add_argument("--theme", choices=("dark", "light"), default="dark", help="colour theme (F2 switches)")
    p.set_defaults(func=_tui)
