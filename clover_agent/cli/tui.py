"""``clover-agent tui`` (and plain ``clover-agent`` at a terminal): the pair-programming TUI."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from clover_agent.cli.options import (
    add_backend_arguments,
    add_budget_arguments,
    add_sandbox_arguments,
    add_trust_argument,
    backend_options,
    check_repo,
    record_key,
    repo_config_of,
    sandbox_kind,
    sandbox_spec_of,
)
from clover_agent.errors import UsageError
from clover_agent.launch import (
    BackendOptions,
    backend_factory,
    check_backend_options,
    hooks_of,
    mcp_servers,
    probe_backend,
)
from clover_agent.settings import Settings

if TYPE_CHECKING:
    from clover_agent.session.assembly import SessionConfig

#: ``--resume`` given without an id: choose from a list.
PICK = "?"


def is_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _tui(args: argparse.Namespace) -> int:
    if not is_terminal():
        raise UsageError("the TUI needs a terminal (stdin and stdout); for scripts use `clover-agent fix`")
    from clover_agent.session.assembly import SessionConfig
    from clover_agent.session.store import list_sessions, load_session, sessions_dir
    from clover_agent.tui.app import CloverApp
    from clover_agent.tui.policies import policy_named

    settings = Settings.load()  # once per command; everything below gets its values passed in
    backend = backend_options(args, progress=None)  # the screen is the TUI's: no load progress
    backend = check_backend_options(backend, settings)  # as fix checks them
    repo = check_repo(args)  # a git repository, as for fix
    sessions_dir(repo)  # a .clover that is a symlink: refused here, before the app starts
    key = record_key(settings, repo).for_kind("session")
    configured = repo_config_of(args, settings, repo, ask=True, say=lambda text: print(text, file=sys.stderr))
    options = SessionConfig(
        repo=repo,
        make_backend=backend_factory(backend, settings),
        sandbox_kind=sandbox_kind(args),
        spec=sandbox_spec_of(args, settings, repo, configured),
        policy=policy_named(args.policy or "workspace"),
        policy_chosen=args.policy is not None,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
        record_key=key,
        mcp_servers=mcp_servers(settings, repo, configured),
        hooks=hooks_of(settings, repo, configured),
    )
    pick_from = None
    if args.resume == PICK:
        pick_from = list_sessions(repo, key)
        if not pick_from:
            raise UsageError(
                f"--resume: there are no saved sessions of yours in {repo / '.clover' / 'sessions'}"
            )
    elif args.resume is not None:
        options.resume = load_session(repo, args.resume, key)
    _check_before_drawing(backend, settings, options)
    app = CloverApp(options, pick_from=pick_from, theme=args.theme)
    code = app.run() or 0
    if app.exit_note:
        print(app.exit_note)
    return code


def _check_before_drawing(backend: BackendOptions, settings: Settings, options: SessionConfig) -> None:
    """What would only fail once the app is up, said before it draws, as ``fix`` says it: a replay
    file that cannot be read, a server that cannot be reached, a Docker engine that does not answer
    or lacks the sandbox image (each a :class:`CloverError` or ``SandboxUnavailable`` with the fix)."""
    asyncio.run(probe_backend(backend, settings))  # a replay's every line; a server serving the model
    spec = options.spec
    if options.sandbox_kind == "docker":
        from clover_agent.sandboxes.docker import docker_client, require_image

        client = docker_client(spec.host_env)
        if spec.image:
            require_image(client, spec.image)


def register(sub: argparse._SubParsersAction) -> None:
    from clover_agent.tui.policies import POLICIES

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
    add_backend_arguments(p)
    add_sandbox_arguments(p)
    add_trust_argument(p)
    add_budget_arguments(p, per_request=True)
    p.add_argument(
        "--policy",
        choices=tuple(POLICIES),
        default=None,
        help="which calls run (default workspace; a resumed session keeps its own): as for fix, plus ask: "
        "ask before every edit and command",
    )
    p.add_argument("--theme", choices=("dark", "light"), default="dark", help="colour theme (F2 switches)")
    p.set_defaults(func=_tui)
