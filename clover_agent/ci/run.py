"""One CI run: from the task text to the files in the output folder.

:func:`run_ci` checks what it is given (the repository is a clean git work tree with no stored
credential, the output folder is the bot's own, the task is not empty once sanitised), builds the
sandbox spec with nothing of the environment in it (:mod:`.safety`), frames the task
(:mod:`.sanitize`) and runs the ``fix`` workflow (:func:`clover_agent.fix.run_fix`) with policy
``ci``, no one to ask, and the output folder as the run folder. The user's working tree is only
read. Whatever happens, it ends with ``result.json`` and ``summary.md`` in the output folder once
that is known to be the bot's (:mod:`.result`), and with ``--json-events`` a ``finished`` line on
stdout; :func:`report_early_error` does the same for a command line that could not be read. In
GitHub Actions the human log is written between ``::stop-commands::`` and its token's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from clover_agent.agent.policy import preset
from clover_agent.agent.trajectory import TRAJECTORY_FILE
from clover_agent.ci.events import JsonEvents
from clover_agent.ci.result import (
    RESULT_FILE,
    SUMMARY_MD,
    build_result,
    render_summary,
    write_result,
)
from clover_agent.ci.safety import local_environment, sandbox_environment, stored_credentials
from clover_agent.ci.sanitize import frame_request, sanitize_task
from clover_agent.errors import RUN_ERRORS, ExitCode, UsageError, exit_code_for, message_of
from clover_agent.events import EventBus
from clover_agent.fix import FixRequest, run_fix
from clover_agent.fix.console import ConsoleRenderer, make_console
from clover_agent.fix.runs import PATCH_FILE, SUMMARY_FILE
from clover_agent.handback.patches import apply_command
from clover_agent.handback.stock import SHADOW_DIR
from clover_agent.launch import (
    BackendOptions,
    backend_factory,
    check_backend_options,
    hooks_of,
    mcp_servers,
    probe_backend,
    sandbox_spec,
)
from clover_agent.safe_text import terminal_safe
from clover_agent.session.assembly import SessionConfig
from clover_agent.settings import REPO_CONFIG, Settings, repo_settings
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S

#: The files a run leaves in the output folder (``summary.json``, the workflow's own, is folded
#: into ``result.json`` and removed, and so is its shadow repository); a folder holding only these
#: is a previous run's, replaced.
OUTPUT_FILES = (PATCH_FILE, RESULT_FILE, SUMMARY_MD, TRAJECTORY_FILE, SUMMARY_FILE)
#: Host-side git never runs the repository's fsmonitor (a program named by its configuration).
_SAFE_GIT = ("git", "-c", "core.fsmonitor=false")


#: Said on every run with ``--sandbox local``.
LOCAL_WARNING = (
    "warning: --sandbox local: the agent's commands run on this machine as this user, with no "
    "isolation and the network; for trying the bot only. CI should use the Docker sandbox (the default)."
)


@dataclass
class CiRequest:
    """What ``clover-agent ci`` was asked: the task as given (untrusted), where, and the budgets."""

    task: str
    task_source: str  # "--task" or "--task-file FILE": what the model is told the request came from
    repo: Path
    output_dir: Path
    backend: BackendOptions
    target: str | None = None
    image: str | None = None
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    #: --json-events: the version of the lines written on stdout (True: the current one); 0/False: none.
    json_events: int = 0
    #: Use the repository's .clover/config.toml whole (its set-up commands, image, packages, wheels):
    #: the workflow's owner decides. Else only what needs no trust (settings.TRUSTED_ONLY).
    trust_repo: bool = False
    #: Where the agent's commands run: "docker" (CI's), or "local" to try the bot on a machine
    #: without Docker (no isolation: said on every run).
    sandbox: str = "docker"


def run_ci(
    request: CiRequest,
    settings: Settings,
    *,
    out: TextIO,
    err: TextIO,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ``request``; returns the exit code (see the module docstring). Human logs go to ``out``,
    or to ``err`` when ``out`` carries the JSON Lines events."""
    events = _events(out, request.json_events)
    log = err if request.json_events else out
    with commands_stopped(log, os.environ if environ is None else environ):
        clean = sanitize_task(request.task)
        task = {"source": request.task_source, "text": clean.text, **clean.to_dict()}
        repo = request.repo.resolve()
        output: Path | None = None
        commit: str | None = None
        fix_summary: dict[str, Any] | None = None
        try:
            output = _prepare_output(request.output_dir.resolve(), repo)
            commit = _check_repository(repo)
            if not clean.text:
                raise UsageError(f"the task ({request.task_source}) is empty once hidden text is removed")
            if (
                request.target is not None
                and request.target.startswith("-")
                and not request.target.startswith("-k ")
            ):
                raise UsageError(
                    f"--target {request.target!r} looks like an option; give a test id, file or `-k EXPR`"
                )
            credentials = stored_credentials(repo)
            if credentials:
                raise UsageError(
                    "the repository's git configuration holds credentials, which would be copied into the "
                    f"sandbox: {'; '.join(credentials)}. Check out with `persist-credentials: false` "
                    "(actions/checkout) or remove them (git config --unset-all KEY)."
                )
            asyncio.run(probe_backend(check_backend_options(request.backend, settings), settings))
            exit_code, message = _run(
                request, settings, repo, output, frame_request(clean, _source(request)), log, events
            )
            fix_summary = _take_fix_summary(output)
        except RUN_ERRORS as exc:
            exit_code, message = exit_code_for(exc), message_of(exc)
        return _end(
            exit_code, message, fix_summary, task, repo, output, commit, request.target, log, events, err
        )


def report_early_error(
    error: BaseException,
    *,
    output_dir: str | None,
    repo: str | None,
    task_source: str | None,
    json_events: int,
    out: TextIO,
    err: TextIO,
    environ: Mapping[str, str] | None = None,
) -> int:
    """A command line that could not be read (argparse's error, an unreadable --task-file, the
    settings): the same ending as :func:`run_ci`'s for a usage error, with what of the command line
    could be read: ``result.json`` and ``summary.md`` in ``output_dir`` when that is usable (the
    rules of :func:`_prepare_output`; without ``repo``, the work tree it lies in), the ``finished``
    line with ``json_events``. Returns the error's exit code."""
    events = _events(out, json_events)
    log = err if json_events else out
    message = message_of(error)
    with commands_stopped(log, os.environ if environ is None else environ):
        output = None
        where = Path(repo).resolve() if repo else None
        if output_dir:
            try:
                output = _prepare_output(Path(output_dir).resolve(), where)
            except (UsageError, OSError) as exc:  # not the bot's folder: nothing written there
                message += f" (nothing written to --output-dir: {message_of(exc) if isinstance(exc, UsageError) else exc})"
        task = {"source": task_source or "", "text": "", "chars": 0, "original_chars": 0, "removed": {},
                "truncated": False}  # fmt: skip
        return _end(
            exit_code_for(error),
            message,
            None,
            task,
            where or Path.cwd(),
            output,
            None,
            None,
            log,
            events,
            err,
        )


def _events(out: TextIO, version: int) -> JsonEvents | None:
    """The JSON Lines writer of ``version`` (True: the current one; 0: none)."""
    if not version:
        return None
    return JsonEvents(out) if version is True else JsonEvents(out, int(version))


@contextlib.contextmanager
def commands_stopped(log: TextIO, environ: Mapping[str, str]) -> Iterator[None]:
    """In GitHub Actions (``GITHUB_ACTIONS=true``), what is written to ``log`` inside is written
    between ``::stop-commands::TOKEN`` and ``::TOKEN::``: the runner obeys no workflow command in
    it, whatever the model or a tool wrote and however a line is wrapped. The token is random, made
    after the sandbox and the model could see anything of this process, and never shown to them."""
    if environ.get("GITHUB_ACTIONS") != "true":
        yield
        return
    token = f"clover-{secrets.token_hex(16)}"
    log.write(f"::stop-commands::{token}\n")
    log.flush()
    try:
        yield
    finally:
        log.flush()
        log.write(f"::{token}::\n")
        log.flush()


def _end(
    exit_code: int,
    message: str,
    fix_summary: dict[str, Any] | None,
    task: dict[str, Any],
    repo: Path,
    output: Path | None,
    commit: str | None,
    target: str | None,
    log: TextIO,
    events: JsonEvents | None,
    err: TextIO,
) -> int:
    """The run's files, its ``finished`` line and its summary in the log: every way out ends here."""
    patch_text = ""
    if output is not None:
        # The workflow's shadow repository (the patch's exact bytes, for a hand-back the bot never
        # makes): patch.diff holds the patch, so it goes, whatever the outcome.
        shutil.rmtree(output / SHADOW_DIR, ignore_errors=True)
        patch_path = output / PATCH_FILE
        if not patch_path.exists():
            patch_path.write_text("", encoding="utf-8")
        patch_text = patch_path.read_text(encoding="utf-8", errors="replace")
    result = build_result(
        exit_code=exit_code,
        message=message,
        fix=fix_summary,
        task=task,
        repo=repo,
        starting_commit=commit,
        patch_text=patch_text,
        apply=_apply_command(repo) if commit else None,
        trajectory=output is not None and (output / TRAJECTORY_FILE).exists(),
        target=target,
    )
    if output is not None:
        write_result(output, result)
    if events is not None:
        events.finished(result, time.time())
    log.write("\n" + render_summary(result))
    if output is not None:
        log.write(f"Outputs: {output}/ ({', '.join(sorted(p.name for p in output.iterdir()))})\n")
    log.flush()
    if result["exit_code"] != ExitCode.OK:
        err.write(f"clover-agent: {terminal_safe(message)}\n")
        err.flush()
    return int(result["exit_code"])


def _run(
    request: CiRequest,
    settings: Settings,
    repo: Path,
    output: Path,
    framed: str,
    log: TextIO,
    events: JsonEvents | None,
) -> tuple[int, str]:
    """The ``fix`` workflow on the request: (exit code, message)."""
    configured = repo_settings(repo, trusted=request.trust_repo)
    if request.sandbox == "local":
        log.write(LOCAL_WARNING + "\n")
    if configured.ignored:
        log.write(
            f"note: {REPO_CONFIG}'s {', '.join(configured.ignored)} ignored: the repository's file is "
            "not trusted (pass --trust-repo in a workflow that checks out only code you trust)\n"
        )
    spec = sandbox_spec(
        settings,
        repo,
        image=request.image,
        network=False,
        env=sandbox_environment(settings.environment),
        # Docker: the engine's address only, never into the container; local: a path to programs
        host_env=settings.docker_env
        if request.sandbox == "docker"
        else local_environment(settings.environment),
        repo_config=configured,
    )
    spec.setup_network = False  # the sandbox never has the network, not even for set-up commands
    session = SessionConfig(
        repo=repo,
        make_backend=backend_factory(request.backend, settings),
        spec=spec,
        sandbox_kind=request.sandbox,
        policy=preset("ci"),
        max_steps=request.max_steps,
        max_time_s=request.max_time_s,
        max_tokens=request.max_tokens,
        mcp_servers=mcp_servers(settings, repo, configured),
        hooks=hooks_of(settings, repo, configured),
    )
    fix_request = FixRequest(
        target=request.target or "",
        session=session,
        run_dir=output,
        command="ci",
        approvals=None,
        suite_timeout_s=configured.suite_timeout or DEFAULT_TIMEOUT_S,
        test_timeout_s=configured.test_timeout,
        request=framed,
        whole_run_time=True,  # --max-time: the whole run's deadline
        exit_codes={ExitCode.AGENT_ERROR: ExitCode.FAILURE},  # one code: trajectory, result, process
        blocked_exit_code=ExitCode.BLOCKED,  # a task a hook kept from the model is no failed fix
    )
    bus = EventBus()
    bus.subscribe(ConsoleRenderer(make_console(log), live=False))  # a log: plain lines
    if events is not None:
        bus.subscribe(events)
    try:
        report = asyncio.run(run_fix(fix_request, bus))
    except KeyboardInterrupt:  # the workflow wrote its summary (exit 130) on the way out
        return ExitCode.INTERRUPTED, "interrupted"
    return report.exit_code, report.message


def _source(request: CiRequest) -> str:
    """Where the request came from, as the model is told."""
    return "the task given to this CI run" + (" in a file" if request.task_source != "--task" else "")


def _take_fix_summary(output: Path) -> dict[str, Any] | None:
    """The workflow's ``summary.json`` (read, then removed: ``result.json`` holds it all)."""
    path = output / SUMMARY_FILE
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    return summary


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_SAFE_GIT, "-C", str(repo), *args], capture_output=True, text=True, check=False)


def _prepare_output(output: Path, repo: Path | None) -> Path:
    """The output folder, made, and emptied of a previous run's files; a :class:`UsageError` when it
    holds other files, or lies in the repository's working tree (None: whatever work tree it lies
    in) without being ignored there."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output-dir {output} is a file, not a folder")
    if repo is None:
        repo = _work_tree_of(output)
    if repo is not None and (output == repo or repo in output.parents):
        # As a folder ("out/"), so that a pattern for folders matches one not made yet.
        ignored = _git(repo, "check-ignore", "-q", "--no-index", f"{output}/").returncode == 0
        if not ignored:
            raise UsageError(
                f"--output-dir {output} is inside the repository and not ignored by git: the run's files "
                "would change the working tree. Use a folder outside it (in GitHub Actions: "
                "${{ runner.temp }}/clover)."
            )
    if output.is_dir():
        others = sorted(p.name for p in output.iterdir() if p.name not in (*OUTPUT_FILES, SHADOW_DIR))
        if others:
            raise UsageError(
                f"--output-dir {output} is not empty ({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}); "
                "give an empty or new folder"
            )
        for name in OUTPUT_FILES:  # a previous run's
            (output / name).unlink(missing_ok=True)
        shutil.rmtree(output / SHADOW_DIR, ignore_errors=True)  # a killed run's
    output.mkdir(parents=True, exist_ok=True)
    return output


def _work_tree_of(path: Path) -> Path | None:
    """The top of the git work tree ``path`` (or its nearest existing folder) lies in, if any."""
    folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if folder is None:
        return None
    top = _git(folder, "rev-parse", "--show-toplevel")
    return Path(top.stdout.strip()).resolve() if top.returncode == 0 and top.stdout.strip() else None


def _check_repository(repo: Path) -> str:
    """The starting commit (``HEAD``) of ``repo``, a git work tree with no uncommitted change (the
    patch is made against that commit); :class:`UsageError` otherwise."""
    if not repo.is_dir():
        raise UsageError(f"--repo {repo}: no such folder")
    head = _git(repo, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    if _git(repo, "rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        raise UsageError(
            f"--repo {repo} is not in a git work tree (the bot's patch is made against a commit)"
        )
    if head.returncode != 0:
        raise UsageError(f"--repo {repo} has no commit yet (the bot's patch is made against a commit)")
    status = _git(repo, "status", "--porcelain", "--untracked-files=all", "--", ".")
    dirty = status.stdout.splitlines()
    if dirty:
        raise UsageError(
            f"--repo {repo} has uncommitted changes or untracked files ({'; '.join(d.strip() for d in dirty[:5])}"
            f"{' ...' if len(dirty) > 5 else ''}); the bot works on a commit, so that its patch applies to it"
        )
    return head.stdout.strip()


def _apply_command(repo: Path) -> str:
    """How to apply ``patch.diff`` at the top of the repository's work tree."""
    command = apply_command(repo, Path(PATCH_FILE))  # git -C REPO apply [--directory=...] patch.diff
    return shlex.join(["git", *command[3:]])
