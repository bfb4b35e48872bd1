"""Command-line options that several commands share (``fix``, ``tui``, and the CI bot): the model
backend, the sandbox, the repository and the budgets, defined once so they mean the same
everywhere.

An option of one backend selects it (:func:`chosen_backend`). A run records how it was started
(:func:`launch_record`), so ``fix --resume`` needs no flags: :func:`apply_launch_record` fills in
what the command line leaves out, except the sandbox: a run leaves Docker only when the command
line says so.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clover_agent.agent.records import RecordKey
from clover_agent.backends import BACKEND_KINDS
from clover_agent.errors import UsageError
from clover_agent.launch import BackendOptions, sandbox_spec
from clover_agent.safe_text import terminal_safe
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.factory import SANDBOX_KINDS
from clover_agent.settings import (
    REPO_CONFIG,
    RepoSettings,
    Settings,
    config_digest,
    repo_settings,
    set_trust,
    trusted_digest,
    trusted_only_values,
)

DEFAULT_BACKEND = "engine"
DEFAULT_SANDBOX = "docker"

#: Backend options: (attribute, flag, the backend it belongs to).
BACKEND_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("model", "--model", "engine"),
    ("base_url", "--base-url", "openai"),
    ("model_name", "--model-name", "openai"),
    ("replay", "--replay", "replay"),
)
#: What each backend is, for the messages that point a flag to its backend.
BACKEND_WORDS = {
    "engine": "runs Clover in this process from --model DIR",
    "openai": "asks the server at --base-url URL",
    "replay": "plays the recorded turns of --replay FILE and runs no model",
}


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--model``, ``--base-url``, ``--model-name``, ``--replay``."""
    p.add_argument(
        "--backend",
        choices=BACKEND_KINDS,
        help="engine: Clover in this process (the default); openai: an OpenAI-compatible server; "
        "replay: recorded turns (tests and demos, not a model). An option of one backend selects "
        "it (--replay FILE: replay; --base-url: openai; --model: engine)",
    )
    p.add_argument("--model", metavar="DIR", help="Clover weights folder (engine backend)")
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible server's API root, e.g. http://HOST:30000/v1 (openai backend; default "
        "CLOVER_BASE_URL; the API key, if it needs one, comes from CLOVER_API_KEY or OPENAI_API_KEY)",
    )
    p.add_argument(
        "--model-name", metavar="NAME", help="model name sent to the server (openai backend; default: clover)"
    )
    p.add_argument("--replay", metavar="FILE", help="recorded assistant turns, JSON Lines (replay backend)")


def add_sandbox_arguments(p: argparse.ArgumentParser) -> None:
    """``--sandbox``, ``--image``, ``--with-compiler`` and ``--wheels``."""
    p.add_argument(
        "--sandbox",
        choices=SANDBOX_KINDS,
        help=f"{DEFAULT_SANDBOX}: an isolated container (the default); local: a private copy on this "
        "machine, no isolation",
    )
    p.add_argument("--image", metavar="IMG", help="Docker image for the sandbox")
    p.add_argument(
        "--with-compiler",
        action="store_true",
        help="start the Docker sandbox from the image's compiler variant (gcc, libc6-dev and python3-dev "
        "added, so a C extension builds; made once from Debian's mirror and cached), as "
        "[sandbox] compiler = true does",
    )
    p.add_argument(
        "--wheels",
        metavar="DIR",
        help="a folder of wheels/sdists (made with `pip download -d DIR ...`) the project's environment "
        "is installed from, besides the package index (alone with [sandbox] setup_network = false)",
    )


def sandbox_spec_of(
    args: argparse.Namespace, settings: Settings, repo: Path, repo_config: RepoSettings
) -> SandboxSpec:
    """The complete sandbox spec the sandbox options chose (the project's environment is built for
    the Docker sandbox), with the repository's settings as :func:`repo_config_of` trusted them."""
    return sandbox_spec(
        settings,
        repo,
        image=args.image,
        environment=sandbox_kind(args) == "docker",
        wheels=args.wheels,
        compiler=args.with_compiler,
        repo_config=repo_config,
    )


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    """``--trust-repo``."""
    p.add_argument(
        "--trust-repo",
        action="store_true",
        help="use the repository's .clover/config.toml whole for this run, its set-up commands, image, "
        "packages and wheels too (a file you have not trusted with `clover-agent trust` has those "
        "ignored; at a terminal you are asked)",
    )


def shown_value(value: Any) -> str:
    """A value from a repository's file as JSON, inert on a terminal (:func:`terminal_safe`)."""
    return terminal_safe(json.dumps(value, ensure_ascii=False), single_line=True)


def trust_request(repo: Path) -> list[str]:
    """What the repository's file sets that needs trust, one ``key = value`` line each."""
    return [
        f"[{key}]: {shown_value(value)}"
        if key.startswith(("mcp_servers.", "hooks."))
        else f"[sandbox] {key} = {shown_value(value)}"
        for key, value in trusted_only_values(repo).items()
    ]


def repo_config_of(
    args: argparse.Namespace, settings: Settings, repo: Path, *, ask: bool, say: Callable[[str], None]
) -> RepoSettings:
    """The repository's ``.clover/config.toml`` as far as it is trusted: whole with ``--trust-repo``
    or when the user trusted this very file for this repository (``clover-agent trust``); else,
    when it sets a key that needs trust (:data:`~clover_agent.settings.TRUSTED_ONLY`), the user is
    asked when ``ask`` (at a terminal; yes records the trust), and otherwise those keys are ignored
    and ``say`` is told which, and how to trust the file."""
    digest = config_digest(repo)
    if digest is None:
        return RepoSettings()
    recorded = trusted_digest(settings, repo)
    if getattr(args, "trust_repo", False) or recorded == digest:
        return repo_settings(repo, trusted=True)
    untrusted = repo_settings(repo)
    if not untrusted.ignored:
        return untrusted
    changed = " (it changed since you trusted it)" if recorded else ""
    if ask:
        print(f"{repo / REPO_CONFIG}{changed} asks for:", file=sys.stderr)
        for line in trust_request(repo):
            print(f"  {line}", file=sys.stderr)
        print(
            "Set-up commands run in the sandbox with the network; wheels are copied into it; MCP servers "
            "run as programs; hooks run as commands on this machine, as you.",
            file=sys.stderr,
        )
        try:
            answer = input(f"Trust this file for {repo}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            trusted = repo_settings(repo, trusted=True)  # a bad wheels folder: refused before recorded
            set_trust(settings, repo, digest)
            return trusted
    say(
        f"note: {REPO_CONFIG}'s {', '.join(untrusted.ignored)} ignored: you have not trusted this file for "
        f"{repo}{changed}. Review it, then run `clover-agent trust --repo {shlex.quote(str(repo))}` (or pass "
        "--trust-repo) to use them."
    )
    return untrusted


def record_key(settings: Settings, repo: Path) -> RecordKey:
    """The user's key for signing and checking run records (made on first use); refused when the
    settings put it inside the repository, where the repository's own files could be it."""
    path = settings.record_key_path.absolute()
    if path.resolve().is_relative_to(repo.resolve()):
        raise UsageError(
            f"CLOVER_STATE puts the key that signs your run records ({path}) inside the repository {repo}; "
            "set it to a folder of your own outside any repository"
        )
    return RecordKey.load(path)


#: The budgets when neither the command line nor a resumed run's record gives them.
BUDGET_DEFAULTS: dict[str, Any] = {"max_steps": 50, "max_time": 1800.0}


def add_budget_arguments(
    p: argparse.ArgumentParser, *, recorded: bool = False, per_request: bool = False
) -> None:
    """``--max-steps``, ``--max-time``, ``--max-tokens`` for a whole run (``fix``, ``ci``), or for
    each request of a session (``per_request``: ``tui``, ``acp``). ``recorded``: no defaults are set
    (None: not given), so a resumed run can take its recorded budgets; the command then fills in
    :data:`BUDGET_DEFAULTS` itself."""
    defaults = {} if recorded else BUDGET_DEFAULTS
    if per_request:
        steps, seconds, tokens = "model calls per request", "seconds per request", "tokens per request"
    else:
        steps, seconds, tokens = "model calls at most", "seconds at most", "tokens read and written at most"
    p.add_argument(
        "--max-steps",
        type=positive(int),
        default=defaults.get("max_steps"),
        metavar="N",
        help=f"{steps} (default {BUDGET_DEFAULTS['max_steps']})",
    )
    p.add_argument(
        "--max-time",
        type=positive(float),
        default=defaults.get("max_time"),
        metavar="S",
        help=f"{seconds} (default {BUDGET_DEFAULTS['max_time']:g})",
    )
    p.add_argument(
        "--max-tokens",
        type=positive(int),
        metavar="N",
        help=f"{tokens} (default: no limit)",
    )


def sandbox_kind(args: argparse.Namespace) -> str:
    return args.sandbox or DEFAULT_SANDBOX


def chosen_backend(args: argparse.Namespace) -> str:
    """The backend the command line selects, or :class:`UsageError`.

    An option of one backend selects it: ``--replay FILE`` is the replay backend, ``--base-url``
    (or ``--model-name``) the openai backend, ``--model`` the engine; ``--backend`` is needed only
    to say it outright. Options of two backends, or an option of another backend than ``--backend``
    names, are a usage error that says which flag belongs where (never silently ignored)."""
    given = [(flag, owner) for name, flag, owner in BACKEND_FLAGS if getattr(args, name, None)]
    if args.backend is None:
        owners = sorted({owner for _, owner in given})
        if len(owners) > 1:
            flags = ", ".join(f"{flag} ({owner})" for flag, owner in given)
            raise UsageError(f"{flags}: these options belong to different backends; give the options of one")
        return owners[0] if owners else DEFAULT_BACKEND
    for flag, owner in given:
        if owner != args.backend:
            raise UsageError(
                f"{flag} is an option of the {owner} backend, not of --backend {args.backend} (which "
                f"{BACKEND_WORDS[args.backend]}); drop {flag}, or choose --backend {owner}"
            )
    return args.backend


def backend_options(args: argparse.Namespace, **engine_options: Any) -> BackendOptions:
    """The backend the command line chose; ``engine_options`` are more ``EngineBackend`` keywords."""
    return BackendOptions(
        chosen_backend(args),
        model=args.model,
        base_url=args.base_url,
        model_name=args.model_name,
        replay=args.replay,
        replay_start=getattr(args, "replay_start", 0),
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
    try:
        repo = Path(args.repo).resolve()
    except FileNotFoundError:  # a relative path in a current folder that was deleted or moved
        raise UsageError(
            f"--repo {args.repo}: the current folder no longer exists (deleted or moved while this "
            "shell was in it); cd into the repository again, or pass --repo with an absolute path"
        ) from None
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


#: What a launch record holds besides the backend's options: the command's own options (for
#: ``fix`` the regression scope and the suite's and each test's timeouts as the run resolved them, so a resumed run is
#: checked as its baseline was).
RECORDED_OPTIONS = (
    "sandbox",
    "image",
    "wheels",
    "max_steps",
    "max_time",
    "max_tokens",
    "policy",
    "regression",
    "suite_timeout",
    "test_timeout",
)
#: Options that name a file or folder: recorded by their absolute path (a resumption may be started
#: from another folder).
PATH_OPTIONS = ("replay", "model", "wheels")


def launch_record(args: argparse.Namespace, options: BackendOptions) -> dict[str, Any]:
    """How a run was started, for its trajectory (``TaskStarted.launch``): the backend chosen, its
    options (as :func:`~clover_agent.launch.check_backend_options` completed them; a replay file by
    its absolute path, with the turns of it already used), the sandbox and the command's options
    (:data:`RECORDED_OPTIONS`)."""
    record: dict[str, Any] = {"backend": options.kind}
    for name, _, owner in BACKEND_FLAGS:
        value = getattr(options, name)
        if value and owner == options.kind:
            record[name] = str(Path(value).resolve()) if name in PATH_OPTIONS else value
    if options.kind == "replay":
        record["replay_start"] = options.replay_start
    record["sandbox"] = sandbox_kind(args)
    for name in RECORDED_OPTIONS[1:]:
        value = getattr(args, name, None)
        if value is not None:
            record[name] = str(Path(value).resolve()) if name in PATH_OPTIONS else value
    return record


def apply_launch_record(
    args: argparse.Namespace, record: dict[str, Any], replay_turns_used: int
) -> list[str]:
    """Fill ``args`` with what the run was started with, where the command line says nothing (the
    flags it gives win); returns the flags taken from the record, to say so.

    - ``replay_turns_used``: the turns a recorded replay's earlier segments used; a replay taken again
      continues after them.

    The backend is taken whole: the recorded one (with its options) when no backend option is given
    now, else the one the given options select. The sandbox is never taken: a resumed run runs outside
    Docker only when the command line says so now.
    """
    taken: list[str] = []
    backend_given = args.backend is not None or any(getattr(args, name, None) for name, _, _ in BACKEND_FLAGS)
    if not backend_given and record.get("backend") in BACKEND_KINDS:
        args.backend = record["backend"]
        taken.append(f"--backend {args.backend}")
        for name, flag, owner in BACKEND_FLAGS:
            if owner == args.backend and record.get(name):
                setattr(args, name, record[name])
                taken.append(f"{flag} {shlex.quote(str(record[name]))}")
        if args.backend == "replay":
            args.replay_start = replay_turns_used
    for name in RECORDED_OPTIONS[1:]:  # the sandbox: only as the command line says (see fix)
        if getattr(args, name, None) is None and record.get(name) is not None:
            setattr(args, name, record[name])
            taken.append(f"--{name.replace('_', '-')} {shlex.quote(str(record[name]))}")
    return taken
