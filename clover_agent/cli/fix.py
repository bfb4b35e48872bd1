"""``clover-agent fix TARGET``: reproduce a failing test, repair it, verify, hand back a patch."""

from __future__ import annotations

import argparse

from clover_agent.engine.readiness import check_engine
from clover_agent.errors import CloverError, ModelUnavailable
from clover_agent.settings import Settings


def require_engine(model: str | None) -> None:
    """Fail within seconds, with the ways forward, when the embedded engine cannot serve."""
    report = check_engine(model, Settings.load().model_path)
    if not report.ready:
        raise ModelUnavailable(report.explain())


def _fix(args: argparse.Namespace) -> int:
    if args.backend == "engine":
        require_engine(args.model)
    raise CloverError("the agent loop is not built yet (issue 7)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fix",
        help="make a failing test pass and hand back a patch",
        description="Reproduce the failure of TARGET in a sandbox, repair it with the agent, verify, "
        "and keep the patch under .clover/runs/<id>/.",
    )
    p.add_argument("target", help="test node id, test file, keyword, or a free-text description")
    p.add_argument("--repo", default=".", help="repository to work on (default: current folder)")
    p.add_argument("--backend", choices=("engine", "openai", "replay"), default="engine")
    p.add_argument("--model", metavar="DIR", help="Clover weights folder (engine backend)")
    p.set_defaults(func=_fix)
