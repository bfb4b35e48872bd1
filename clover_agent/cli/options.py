"""Command-line options that several commands share (``fix``, ``tui``, and the CI bot): the model
backend, the sandbox, the repository and the budgets, defined once so they mean the same
everywhere."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clover_agent.backends import BACKEND_KINDS
from clover_agent.errors import UsageError
from clover_agent.launch import BackendOptions, sandbox_spec
from clover_agent.sandboxes import SANDBOX_KINDS, SandboxSpec
from clover_agent.settings import Settings


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--model``, ``--base-url``, ``--model-name``, ``--replay``."""
    p.add_argument(
        "--backend",
        choices=BACKEND_KINDS,
        default="engine",
        help="engine: Clover in this process (default); openai: an OpenAI-compatible server; "
        "replay: recorded turns (tests and demos, not a model)",
    )
    p.add_argument("--model", metavar="DIR", help="Clover weights folder (engine backend)")
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible server's API root, e.g. http://HOST:30000/v1 (openai backend; default "
        "CLOVER_BASE_URL; the API key, if it needs one, comes from CLOVER_API_KEY or OPENAI_API_KEY)",
    )
    p.add_argument("--model-name", metavar="NAME", help="model name sent to the server (openai backend)")
    p.add_argument("--replay", metavar="FILE", help="recorded assistant turns, JSON Lines (replay backend)")


def add_sandbox_arguments(p: argparse.ArgumentParser) -> None:
    """``--sandbox``, ``--image`` and ``--wheels``."""
    p.add_argument(
        "--sandbox",
        choices=SANDBOX_KINDS,
        default="docker",
        help="docker: an isolated container (default); local: a private copy on this machine, no isolation",
    )
    p.add_argument("--image", metavar="IMG", help="Docker image for the sandbox")
    p.add_argument(
        "--wheels",
        metavar="DIR",
        help="a folder of wheels/sdists (made with `pip download -d DIR ...`) the project's environment "
        "is installed from, besides the package index (alone with [sandbox] setup_network = false)",
    )


def sandbox_spec_of(args: argparse.Namespace, settings: Settings, repo: Path) -> SandboxSpec:
    """The complete sandbox spec the sandbox options chose (the project's environment is built for
    the Docker sandbox)."""
    return sandbox_spec(
        settings, repo, image=args.image, environment=args.sandbox == "docker", wheels=args.wheels
    )


def add_budget_arguments(p: argparse.ArgumentParser) -> None:
    """``--max-steps``, ``--max-time``, ``--max-tokens`` for a whole run (``fix``, ``ci``)."""
    p.add_argument(
        "--max-steps", type=positive(int), default=50, metavar="N", help="model calls at most (default 50)"
    )
    p.add_argument(
        "--max-time", type=positive(float), default=1800.0, metavar="S", help="seconds at most (default 1800)"
    )
    p.add_argument(
        "--max-tokens",
        type=positive(int),
        metavar="N",
        help="tokens read and written at most (default: no limit)",
    )


def backend_options(args: argparse.Namespace, **engine_options: Any) -> BackendOptions:
    """The backend the command line chose; ``engine_options`` are more ``EngineBackend`` keywords."""
    return BackendOptions(
        args.backend,
        model=args.model,
        base_url=args.base_url,
        model_name=args.model_name,
        replay=args.replay,
        engine_options=engine_options,
    )


#: Files that mark a project's root folder (a --repo that is a subfolder without any is likely a mistake).
PROJECT_FILES = (
    "pyproject.toml",
    "setup.py",
    "package.json",
    "setup.cfg",
    "go.mod",
    "Cargo.toml",
    "pytest.ini",
)


def check_repo(args: argparse.Namespace) -> Path:
    """The repository ``--repo`` names: a git work tree (a note when only a subfolder of one)."""
    repo = Path(args.repo).resolve()
    if not repo.is_dir():
        raise UsageError(f"--repo {args.repo}: no such folder")
    inside = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--is-inside-work-tree", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    answer = inside.stdout.splitlines()  # "true", then the top folder of the work tree
    if len(answer) != 2 or answer[0] != "true":
        raise UsageError(
            f"{repo} is not in a git repository (the agent's changes are handed back as a git patch); run `git init` there"
        )
    top = Path(answer[1]).resolve()
    if top != repo and not any((repo / name).exists() for name in PROJECT_FILES):
        print(
            f"note: only {repo} goes into the sandbox: a subfolder of the git repository {top}, with no "
            f"project file of its own ({', '.join(PROJECT_FILES[:3])}...); for the whole project, pass "
            f"--repo {shlex.quote(str(top))}",
            file=sys.stderr,
        )
    return repo


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) above zero. A budget of 0 would only stop the run
    after the tests were set up, with a budget error instead of a usage error."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be above 0 (got {text})")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse
