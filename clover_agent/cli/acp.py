"""``clover-agent acp``: the agent for editors over the Agent Client Protocol on stdio (docs/acp.md).

The backend, sandbox, trust, budget and policy options mean what they mean for ``tui``; they are
checked when the editor opens a session (``session/new``), where what is missing is the answer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
from clover_agent.launch import backend_factory, check_backend_options, hooks_of, mcp_servers
from clover_agent.settings import Settings


def _acp(args: argparse.Namespace) -> int:
    from clover_agent.acp.server import run
    from clover_agent.acp.session import SessionConfig
    from clover_agent.session.store import load_session, sessions_dir
    from clover_agent.tui.policies import policy_named

    settings = Settings.load()  # once per command; every session gets its values passed in
    policy = policy_named(args.policy)

    def say(text: str) -> None:
        print(text, file=sys.stderr)

    def configure(cwd: Path, session_id: str | None) -> SessionConfig:
        backend = check_backend_options(backend_options(args, progress=None), settings)
        repo = check_repo(argparse.Namespace(repo=str(cwd)))
        sessions_dir(repo)  # a .clover that is a symlink: refused
        key = record_key(settings, repo).for_kind("session")
        configured = repo_config_of(args, settings, repo, ask=False, say=say)
        return SessionConfig(
            repo=repo,
            make_backend=backend_factory(backend, settings),
            sandbox_kind=sandbox_kind(args),
            spec=sandbox_spec_of(args, settings, repo, configured),
            policy=policy,
            max_steps=args.max_steps,
            max_time_s=args.max_time,
            max_tokens=args.max_tokens,
            record_key=key,
            resume=None if session_id is None else load_session(repo, session_id, key),
            mcp_servers=mcp_servers(settings, repo, configured),
            hooks=hooks_of(settings, repo, configured),
        )

    return run(configure)


def register(sub: argparse._SubParsersAction) -> None:
    from clover_agent.tui.policies import POLICIES

    p = sub.add_parser(
        "acp",
        help="serve an editor (Zed, Neovim, JetBrains, ...) over the Agent Client Protocol on stdio",
        description="The agent for editors: the Agent Client Protocol (JSON-RPC) on stdin/stdout, logs on\n"
        "stderr. The editor opens a session per repository (its cwd); the agent works in a sandboxed\n"
        "copy and offers its checked changes at the end of each request. See docs/acp.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_backend_arguments(p)
    add_sandbox_arguments(p)
    add_trust_argument(p)
    add_budget_arguments(p, per_request=True)
    p.add_argument(
        "--policy",
        choices=tuple(POLICIES),
        default="workspace",
        help="which calls run without asking (default workspace); ask: ask before every edit and command",
    )
    p.set_defaults(func=_acp)
