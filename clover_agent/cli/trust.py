"""``clover-agent trust``: trust a repository's ``.clover/config.toml`` (as it is now) for that
repository, so ``fix``, the TUI and the CI bot use its set-up commands, image, packages and wheels,
start its MCP servers and run its hooks (docs/hooks.md).

The trust is kept in the user's own folder (``CLOVER_STATE``), keyed by the repository's path and
the file's SHA-256: a changed file (a new commit, a branch, an agent's edit) is not trusted until
the user trusts it again. ``--revoke`` forgets it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from clover_agent.cli.options import shown_value, trust_request
from clover_agent.errors import ExitCode, UsageError
from clover_agent.settings import (
    REPO_CONFIG,
    Settings,
    config_digest,
    repo_settings,
    set_trust,
    trusted_digest,
)


def _trust(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    if not repo.is_dir():
        raise UsageError(f"--repo {args.repo}: no such folder")
    settings = Settings.load()
    if args.revoke:
        had = trusted_digest(settings, repo) is not None
        set_trust(settings, repo, None)
        print(f"{repo / REPO_CONFIG}: {'no longer trusted' if had else 'was not trusted'}")
        return ExitCode.OK
    digest = config_digest(repo)
    if digest is None:
        raise UsageError(f"{repo} has no {REPO_CONFIG}: there is nothing to trust")
    repo_settings(repo, trusted=True)  # a broken file, or wheels outside the repository: refused
    asks = trust_request(repo)
    print(f"{repo / REPO_CONFIG} (sha256 {digest[:16]}…) asks for:")
    for line in asks or ["nothing that needs trust"]:
        print(f"  {line}")
    if any(line.startswith("[hooks.") for line in asks):
        print("Its hooks will run as commands on this machine, as you, on the agent's events.")
    set_trust(settings, repo, digest)
    print(
        f"trusted for {shown_value(str(repo))[1:-1]} until the file changes (`clover-agent trust --revoke`)"
    )
    return ExitCode.OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trust",
        help="trust a repository's .clover/config.toml (its set-up commands, image, packages, wheels, "
        "MCP servers, hooks)",
        description="Show what the repository's .clover/config.toml asks for and trust it, as it is now,\n"
        "for that repository: fix, tui and ci then run its set-up commands (with the network), use its\n"
        "image and packages, copy its wheels folder (inside the repository) into the environment and\n"
        "start its MCP servers and run its hooks (commands on this machine, as you: docs/hooks.md).\n"
        "A changed file needs trusting again.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repo", default=".", help="the repository (default: current folder)")
    p.add_argument("--revoke", action="store_true", help="forget the trust given to the repository's file")
    p.set_defaults(func=_trust)
