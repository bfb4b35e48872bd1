"""``clover-agent runs``: the ``fix`` runs of a repository, and one of them shown whole.

``runs`` lists the runs under ``<repo>/.clover/runs`` (newest last): id, target, result, model
calls, backend. ``runs show ID`` (or ``last``) prints the run's summary, its patch and a readable
transcript: the run's trajectory rendered as ``fix`` renders it live (thinking one line a turn
unless ``-v``, tool results trimmed). A run still going, or killed, has no summary yet; what its
trajectory holds is shown. A run's files are the repository's, untrusted: all they say is shown through
:func:`clover_agent.safe_text.terminal_safe`.

Only what this user's clover-agent wrote is read (the records are signed:
:mod:`clover_agent.agent.records`): ``runs`` lists any other folder there as foreign, with nothing
of its contents, and ``runs show`` refuses it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.text import Text

from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryError, read_events
from clover_agent.cli.handback import colored_diff
from clover_agent.cli.options import record_key
from clover_agent.errors import ExitCode, UsageError
from clover_agent.events import Event, ModelResponded, TaskFinished, TaskResumed, TaskStarted
from clover_agent.fix.console import ConsoleRenderer, make_console
from clover_agent.fix.runs import PATCH_FILE, RUNS_DIR, SUMMARY_FILE, check_signed, locate_run, record_problem
from clover_agent.safe_text import shown_names, terminal_safe
from clover_agent.settings import Settings


def _summary(run: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _events(run: Path) -> list[Event]:
    try:
        return read_events(run / TRAJECTORY_FILE)
    except TrajectoryError:
        return []


def _result(summary: dict[str, Any] | None, events: list[Event]) -> str:
    finished = next((e for e in reversed(events) if isinstance(e, TaskFinished)), None)
    if summary is None and finished is None:
        return "no verdict (running, or killed)"
    code = summary["exit_code"] if summary else finished.exit_code  # type: ignore[union-attr]
    message = str(summary["message"] if summary else finished.message)  # type: ignore[union-attr]
    if code == ExitCode.OK:
        hand_back = summary.get("hand_back") if summary else None
        return "fixed" + (f" ({hand_back})" if hand_back else "")
    short = message.splitlines()[0] if message else ""
    return f"exit {code}: {short[:70] + '…' if len(short) > 70 else short}"


def _list(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    runs = repo / RUNS_DIR
    folders = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    settings = Settings.load()
    console = make_console(environ=settings.environment)
    if not folders:
        console.print(f"no runs under {runs} (`clover-agent fix TARGET` makes one)")
        return ExitCode.OK
    key = record_key(settings, repo)
    rows: list[tuple[str, ...]] = []
    for run in folders:
        if record_problem(run, key) is not None:
            rows.append((shown_names([run.name]), "?", "foreign: not written by your clover-agent", "", ""))
            continue
        summary, events = _summary(run), _events(run)
        started = next((e for e in events if isinstance(e, TaskStarted)), None)
        target = started.target if started else "?"
        calls = sum(isinstance(e, ModelResponded) for e in events)
        backend = summary.get("backend") if summary else ""
        if not backend and started is not None:
            backend = started.launch.get("backend", "")
        segments = 1 + sum(isinstance(e, TaskResumed) for e in events)
        target = terminal_safe(str(target), single_line=True)
        cells = (
            run.name,
            target if len(target) <= 40 else target[:39] + "…",
            _result(summary, events) + (f" [{segments} segments]" if segments > 1 else ""),
            str(calls),
            str(backend or ""),
        )
        rows.append(tuple(terminal_safe(cell, single_line=True) for cell in cells))
    header = ("RUN", "TARGET", "RESULT", "CALLS", "BACKEND")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
        console.print(Text(line.rstrip(), style="bold" if row is header else ""))
    return ExitCode.OK


def _show(args: argparse.Namespace) -> int:
    repo, run = locate_run(args.run, None if args.repo == "." else Path(args.repo), flag="runs show")
    settings = Settings.load()
    console = make_console(environ=settings.environment)
    check_signed(run, record_key(settings, repo))
    summary, events = _summary(run), _events(run)
    if not events and summary is None:
        raise UsageError(f"run {run.name} has neither a trajectory nor a summary in {run}")
    lines = [f"run {shown_names([run.name])} of {repo}", f"  result      {_result(summary, events)}"]
    if summary is not None:
        agent = summary.get("agent") or {}
        lines.append(f"  target      {summary.get('target', '')}")
        changed = shown_names(str(name) for name in summary.get("files_changed") or [])
        lines.append(f"  changed     {changed or 'nothing'}")
        if agent:
            lines.append(
                f"  agent       {agent.get('outcome')}; {agent.get('steps', 0)} steps, {agent.get('tokens', 0):,} "
                f"tokens, {agent.get('elapsed_s', 0):.1f} s; backend {summary.get('backend', '')}"
            )
        lines.append(f"  time        {summary.get('elapsed_s', 0):.1f} s")
    for i, line in enumerate(lines):  # each one line, whatever the summary holds
        console.print(Text(terminal_safe(line, single_line=True), style="bold" if i == 0 else ""))
    patch = run / PATCH_FILE
    text = patch.read_text(encoding="utf-8", errors="replace") if patch.is_file() else ""
    console.print(Text("\npatch" + ("" if text.strip() else ": none"), style="bold"))
    if text.strip():
        console.print(colored_diff(text), end="")
    if not args.no_transcript:
        console.print(Text("\ntranscript", style="bold"))
        renderer = ConsoleRenderer(console, verbose=args.verbose, live=False)
        for event in events:
            renderer(event)
        renderer.close()
    return ExitCode.OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runs",
        help="list the fix runs of a repository, or show one (`runs show ID`)",
        description="The runs `clover-agent fix` made in a repository (under .clover/runs/), newest "
        "last; `runs show ID` prints one run's summary, patch and transcript.",
    )
    p.add_argument("--repo", default=".", help="the repository (default: current folder)")
    actions = p.add_subparsers(dest="runs_command", metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="one run: its summary, its patch and a readable transcript",
        description="Print a run's summary, its patch and its transcript (thinking folded to one "
        "line a turn unless -v; tool results trimmed: the trajectory keeps them whole).",
    )
    show.add_argument("run", metavar="RUN_ID", help="the run's id, `last`, or its folder")
    show.add_argument("--repo", default=".", help="the repository (default: current folder)")
    show.add_argument("-v", "--verbose", action="store_true", help="the model's thinking whole")
    show.add_argument("--no-transcript", action="store_true", help="only the summary and the patch")
    show.set_defaults(func=_show)
    p.set_defaults(func=_list)
