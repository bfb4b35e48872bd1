"""The terminal side of a ``fix`` run: its events as text, a live status line, and approvals.

:class:`ConsoleRenderer` writes a concise log and, at a terminal, a live area with the line being
written and a status line whose figures come from :mod:`clover_agent.fix.progress`;
:class:`TerminalApprover` answers the agent's approval requests with what the person types. Every
line goes through :func:`clover_agent.safe_text.terminal_safe`, since everything shown comes from
the model, a tool or the repository: an escape sequence is shown, never obeyed. The renderer, its
live area and the approver share one terminal and its state, hence one module.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from clover_agent.agent.approvals import Answer, Approvals, Reply
from clover_agent.agent.plan import Plan
from clover_agent.backends.threads import run_in_daemon_thread
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetWarning,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    HookRan,
    ModelDelta,
    ModelResponded,
    PhaseStarted,
    PlanUpdated,
    SandboxProgress,
    TaskFinished,
    TaskResumed,
    TaskStarted,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.fix.progress import MIN_RATE_SECONDS, RunFigures
from clover_agent.hooks import hook_line
from clover_agent.safe_text import terminal_safe

TOOL_CALL_TAG = "<tool_call>"
RESULT_LINES = 8
RESULT_WIDTH = 160
THINKING = "thinking │ "
#: Refreshes of the live area per second.
REFRESH_PER_SECOND = 4

STYLES = {
    "task": "bold",
    "call": "bold cyan",
    "ok": "green",
    "error": "red",
    "note": "yellow",
    "thinking": "dim italic",
    "result": "dim",
    "status": "dim",
    "tests": "bold",
}


def make_console(out: TextIO | None = None, environ: Mapping[str, str] | None = None) -> Console:
    """A rich console on ``out`` (stdout) that prints text as given (no markup, no highlighting) and
    takes the terminal's settings from ``environ`` (the settings' copy of the environment; none:
    none set): ``NO_COLOR`` (no colour and no other style either: plain text), ``FORCE_COLOR``,
    ``TERM`` (``dumb``: no live area), ``COLUMNS``."""
    # Set but empty is not set (no-color.org, force-color.org); rich would take an empty FORCE_COLOR
    # as "not a terminal".
    environ = {k: v for k, v in (environ or {}).items() if v or k not in ("NO_COLOR", "FORCE_COLOR")}
    return Console(
        file=out or sys.stdout,
        markup=False,
        highlight=False,
        emoji=False,
        soft_wrap=True,
        color_system=None if environ.get("NO_COLOR") else "auto",
        _environ=environ,
    )


def write_plain(console: Console, text: str) -> None:
    """Write ``text`` (:func:`terminal_safe`) and a newline on ``console``'s file, unstyled. Not
    while a live area is drawn (the command's last lines: the summary, the hand-back)."""
    console.file.write(terminal_safe(text) + "\n")
    console.file.flush()


class ConsoleRenderer:
    """Bus subscriber writing a run's events on ``console``.

    - ``figures``: the run's :class:`RunFigures` (subscribe it before this renderer).
    - ``verbose``: the model's thinking in full (else folded to one line per turn).
    - ``quiet``: write nothing (the command's summary and errors still are).
    - ``live=False``: recorded events (``clover-agent runs show``): no live area, each call's figures on
      a line.

    The log: model text as it is written (line by line), each tool call on one line, results trimmed
    (the trajectory keeps them whole), and test runs. The model's thinking is shown dim and labelled.
    Provisional diffusion blocks are not drawn (the TUI does) but count in the figures.

    At a terminal, a live area at the bottom holds the line being written and a status line that updates
    while the model works: what is going on now, for how long, step N/limit, tokens in/out, tokens/s
    and, for the engine, tokens per forward.

    Styles come from rich and follow the terminal: colour only at a terminal and without ``NO_COLOR``.
    When the output is not a terminal (or ``TERM=dumb``) there is no live area: plain lines for logs and
    scripts, with each model call's figures on a line of their own.

    Errors that end the run are not written here: the command says them once, at the end.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        figures: RunFigures | None = None,
        verbose: bool = False,
        quiet: bool = False,
        live: bool = True,
    ) -> None:
        self.console = console or make_console()
        self.figures = figures or RunFigures()
        self.verbose = verbose
        self.quiet = quiet
        # The live area: at a terminal, for a run going on (not a recorded one: ``live=False``).
        self.live_view = live and self.console.is_terminal and not self.console.is_dumb_terminal and not quiet
        self._live: Live | None = None
        self._kind = ""  # what streams now: "text" or "reasoning"
        self._turn_text = ""  # streamed so far of that kind, in the current model turn
        self._shown = 0  # how much of it went out (as lines, or into the pending line)
        self._pending = ""  # the line being written (not yet ended by a newline)
        self._streamed: set[str] = set()  # kinds this turn streamed (not to repeat them)
        self._thinking_lines = 0
        self._thinking_first = ""
        self._blank = False  # a blank line waits to be written
        self._lines_of_kind = 0  # non-blank lines of the current kind written so far

    # -- events --------------------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        if self.quiet:
            return
        if isinstance(event, ModelDelta):
            if event.kind != self._kind:
                self._flush_stream()
                self._kind, self._turn_text, self._shown = event.kind, "", 0
            self._streamed.add(event.kind)
            self._stream(event.text)
        elif isinstance(event, ModelResponded):
            self._end_turn(event)
        elif isinstance(event, ToolCallStarted):
            self._flush_stream()
            self._line(f"→ {event.name} {_arguments(event.arguments)}", "call")
        elif isinstance(event, ToolCallFinished):
            mark, style = ("✗", "error") if event.is_error else ("✓", "ok")
            text = Text("  ")
            text.append(mark, style=STYLES[style])
            text.append(" " + _trim(terminal_safe(event.output)), style=STYLES["result"])
            self._print(text)
        elif isinstance(event, ApprovalRequested):
            self._stop_live()  # the question is asked on the terminal; the live area would cover it
        elif isinstance(event, ApprovalDecided):
            self._start_live()
            verdict = "allowed" if event.approved else "denied"
            who = DECIDED_BY.get(event.decided_by, f"by {event.decided_by}")
            answer = f", answered {event.answer}" if event.answer else ""
            self._line(f"  policy: {event.name} {verdict} {who}{answer} ({event.reason})", "note")
        elif isinstance(event, ContextCondensed):
            self._line(
                f"  context: {event.tokens_before:,} → {event.tokens_after:,} tokens; "
                f"{len(event.dropped)} dropped",
                "note",
            )
        elif isinstance(event, BudgetWarning):
            self._line(f"  budget: {event.resource} at {event.used:g} of {event.limit:g}", "note")
        elif isinstance(event, HookRan):
            line = hook_line(event)
            if line is not None:
                self._line(f"  hook: {line}", "note")
        elif isinstance(event, ErrorReported) and not event.fatal:
            self._line(f"  ! {event.kind}: {_trim(terminal_safe(event.message), lines=2)}", "note")
        elif isinstance(event, TaskStarted):
            self._start_live()
            target = repr(event.target) if event.target else "(the tests failing in the suite)"
            self._line(
                f"clover-agent {event.command} {target} in {event.repo} ({event.sandbox} sandbox)", "task"
            )
        elif isinstance(event, TaskResumed):
            self._start_live()
            code = "" if event.previous_exit_code is None else f", exit {event.previous_exit_code}"
            self._line(
                f"clover-agent {event.command} resumes run {event.run_id} (segment {event.segment}) in "
                f"{event.repo} ({event.sandbox} sandbox); it stopped: {event.previous_outcome}{code}: "
                f"{event.previous_message}",
                "task",
            )
        elif isinstance(event, PhaseStarted) and not self.live_view:
            self._line(f"… {event.phase}: {event.detail}" if event.detail else f"… {event.phase}", "status")
        elif isinstance(event, SandboxProgress):
            self._line(f"sandbox: {event.message}", "status")
        elif isinstance(event, TestsRun):
            r = event.report
            if event.chosen:  # which tests the run works on, and why those
                tests = (
                    event.target if len(event.target) <= RESULT_WIDTH else event.target[:RESULT_WIDTH] + "…"
                )
                self._line(f"target: {tests} — {event.chosen}", "tests")
            skipped = f", {r['skipped']} skipped" if r.get("skipped") else ""
            self._line(
                f"tests {event.phase.replace('_', ' ')}: {r.get('passed', 0)} passed, {r.get('failed', 0)} "
                f"failed, {r.get('errors', 0)} errors{skipped}",
                "tests",
            )
        elif isinstance(event, PlanUpdated):
            self._flush_stream()
            self._plan(event)
        elif isinstance(event, Done):
            self._flush_stream()
            if event.outcome == "submitted":  # other endings are said once, by the command, at the end
                self._line(f"finished: {event.summary or event.message}", "ok")
        elif isinstance(event, TaskFinished):
            self._flush_stream()
            self.close()

    def close(self) -> None:
        """Take the live area away (the screen keeps what was printed above it)."""
        self._stop_live()

    # -- the live area -------------------------------------------------------------------------------

    def __rich__(self) -> Group:
        """What the live area shows now (rich calls this at each refresh)."""
        rows: list[Text] = []
        if self._pending.strip():
            style = STYLES["thinking"] if self._kind == "reasoning" else ""
            label = THINKING if self._kind == "reasoning" else ""
            pending = terminal_safe(self._pending, single_line=True)
            rows.append(Text(label + pending[-(self.console.width - len(label) - 1) :], style=style))
        status = terminal_safe(self.figures.status(), single_line=True)
        rows.append(Text("⋯ " + status, style=STYLES["status"], no_wrap=True, overflow="ellipsis"))
        return Group(*rows)

    def _start_live(self) -> None:
        if self.live_view and self._live is None:
            self._live = Live(
                self,
                console=self.console,
                refresh_per_second=REFRESH_PER_SECOND,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- streamed text -------------------------------------------------------------------------------

    def _stream(self, text: str) -> None:
        """Take model text up to its first tool call (calls get their own line); a tag split
        across deltas is held back until it is complete. Whole lines go out; the rest waits."""
        self._turn_text += text
        cut = self._turn_text.find(TOOL_CALL_TAG)
        if cut < 0:
            cut = len(self._turn_text)
            for keep in range(len(TOOL_CALL_TAG) - 1, 0, -1):
                if self._turn_text.endswith(TOOL_CALL_TAG[:keep]):
                    cut -= keep
                    break
        if cut <= self._shown:
            return
        chunk = self._turn_text[self._shown : cut]
        if self._shown == 0:  # the start of this kind's text: no blank lines before it
            chunk = chunk.lstrip("\n")
        self._shown = cut
        *lines, self._pending = (self._pending + chunk).split("\n")
        for line in lines:
            self._stream_line(line)

    def _stream_line(self, line: str) -> None:
        """One whole streamed line; blank ones wait for a line after them (none before a tool call
        or at the end of a turn, at most one in a row)."""
        if not line.strip():
            self._blank = True
            return
        if self._blank and self._lines_of_kind and (self.verbose or self._kind != "reasoning"):
            self._stream_out("")
        self._blank = False
        self._lines_of_kind += 1
        self._stream_out(line)

    def _stream_out(self, line: str) -> None:
        if self._kind == "reasoning":
            self._thinking_lines += 1
            if not self._thinking_first and line.strip():
                self._thinking_first = line.strip()
            if self.verbose:
                self._line(THINKING + line, "thinking")
        else:
            self._line(line)

    def _flush_stream(self) -> None:
        """End the stream of the current kind: its last line goes out, thinking is folded."""
        if self._pending.strip():
            self._stream_line(self._pending.rstrip())
        self._pending = ""
        if self._kind == "reasoning":
            self._fold_thinking()
        self._kind, self._turn_text, self._shown = "", "", 0
        self._blank, self._lines_of_kind = False, 0

    def _fold_thinking(self) -> None:
        if not self.verbose and self._thinking_lines:
            first = self._thinking_first
            if len(first) > 100:
                first = first[:99] + "…"
            more = f" (+{self._thinking_lines - 1} lines; -v shows them)" if self._thinking_lines > 1 else ""
            self._line(f"{THINKING}{first}{more}", "thinking")
        self._thinking_lines, self._thinking_first = 0, ""

    def _end_turn(self, event: ModelResponded) -> None:
        """A turn came back: show what did not stream (a backend that does not stream), and in plain
        output the call's figures."""
        self._flush_stream()
        for kind, text in (("reasoning", event.reasoning), ("text", event.content)):
            if kind not in self._streamed and text and text.strip():
                self._kind = kind
                for line in text.strip().split("\n"):
                    self._stream_line(line)
                self._flush_stream()
        self._streamed.clear()
        if not self.live_view:
            rates = []
            if event.seconds >= MIN_RATE_SECONDS:
                rates.append(f"{event.completion_tokens / event.seconds:,.0f} tok/s")
            if event.forwards:
                rates.append(f"{event.completion_tokens / event.forwards:.2f} tok/forward")
            self._line(
                f"  step {event.step}: {event.completion_tokens:,} tokens out in {event.seconds:.1f} s"
                + (f" ({', '.join(rates)})" if rates else "")
                + f"; prompt {event.prompt_tokens:,} tokens",
                "status",
            )

    # -- output --------------------------------------------------------------------------------------

    def _plan(self, event: PlanUpdated) -> None:
        """A proposed plan in full; an approved one in a line; progress as the step now under way."""
        plan = Plan.from_dict(event.plan)
        if event.stage == "proposed":
            self._line("plan proposed:", "task")
            for line in plan.markdown().splitlines():
                self._line(f"  {line}")
        elif event.stage == "approved":
            self._line(f"plan approved: {len(plan.steps)} steps; carrying it out", "ok")
        elif event.stage == "progress":
            now = next((s.step for s in plan.steps if s.status == "in_progress"), "")
            self._line(
                f"plan: {plan.done}/{len(plan.steps)} done" + (f"; now: {now}" if now else ""), "status"
            )

    def _line(self, text: str, style: str = "") -> None:
        self._print(Text(terminal_safe(text), style=STYLES.get(style, "")))

    def _print(self, text: Text) -> None:
        self.console.print(text)


class ProgressText(io.TextIOBase):
    """A text stream for a backend's own progress (the engine loading its weights, which writes
    lines and a line refreshed with carriage returns): whole lines are written as dim lines, the
    line being refreshed is shown in the status line. Written from the loader's thread."""

    def __init__(self, renderer: ConsoleRenderer) -> None:
        self.renderer = renderer
        self._buffer = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._buffer = (self._buffer + text).split("\n")
        for line in lines:
            shown = line.rsplit("\r", 1)[-1].strip()
            if shown and not self.renderer.quiet:
                self.renderer._line(shown, "status")
        self.renderer.figures.loading = self._buffer.rsplit("\r", 1)[-1].strip()
        return len(text)


def _arguments(arguments: dict[str, Any]) -> str:
    """The call's arguments on one line, each cut to 60 characters (shown :func:`terminal_safe`)."""
    parts = []
    for key, value in arguments.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        shown = " ".join(terminal_safe(str(shown), single_line=True).split())
        if len(shown) > 60:
            shown = shown[:59] + "…"
        parts.append(f"{terminal_safe(key, single_line=True)}={shown}")
    return " ".join(parts)


def _trim(text: str, lines: int = RESULT_LINES) -> str:
    rows = text.strip().splitlines() or [""]
    shown = [r if len(r) <= RESULT_WIDTH else r[: RESULT_WIDTH - 1] + "…" for r in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"… {len(rows) - lines} more lines")
    return "\n    ".join(shown)


#: Who decided a call the policy did not simply allow (``ApprovalDecided.decided_by``), in words.
DECIDED_BY = {
    "user": "by you",
    "remembered": 'by your "always" earlier in this run',
    "policy": "by the policy",
    "no-terminal": "(no terminal to ask at)",
    "hook": "by your hook",
}


def question_text(name: str, arguments: dict[str, Any], reason: str, always: str = "") -> str:
    """The approval question, in words (the arguments as the call line shows them, not reprs), with
    what an "always" answer would allow when the agent says it (``ApprovalRequested.always``)."""
    scope = f"[a] always allows {terminal_safe(always, single_line=True)}.\n" if always else ""
    return (
        f"\nThe agent wants to run {terminal_safe(name, single_line=True)} {_arguments(arguments)}\n"
        f"({terminal_safe(reason, single_line=True)}).\n{scope}"
        f"{APPROVAL_PROMPT}"
    )


#: The last line of the approval question: anything else typed is a "no" that tells the agent why.
APPROVAL_PROMPT = "Allow it? [y] once / [a] always for this run / [N] no, or type what to do instead: "


async def ask_at_terminal(name: str, arguments: dict[str, Any], reason: str, always: str = "") -> Reply:
    """Ask the person at the terminal about one call; end of input (Ctrl-D) is no. An answer that is
    none of the choices is a denial carrying the typed words, which the model reads with it."""
    question = question_text(name, arguments, reason, always)
    try:
        # A daemon thread: a run that ends (Ctrl-C) while the question waits does not wait for it.
        typed = await run_in_daemon_thread(lambda: input(question), name="clover-approval")
    except EOFError:
        return Reply(Answer.DENY)
    answer = typed.strip().lower()
    if answer in ("a", "always"):
        return Reply(Answer.ALWAYS)
    if answer in ("y", "yes", "once"):
        return Reply(Answer.ONCE)
    if answer in ("", "n", "no"):
        return Reply(Answer.DENY)
    return Reply(Answer.DENY, typed.strip())


class TerminalApprover:
    """Bus subscriber: asks at the terminal about each ``ApprovalRequested`` and answers it through
    ``approvals`` by its call id. The question runs as its own task, so the bus never waits on it."""

    def __init__(self, approvals: Approvals) -> None:
        self.approvals = approvals
        self._asking: set[asyncio.Task[None]] = set()

    def __call__(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask(self, event: ApprovalRequested) -> None:
        reply = await ask_at_terminal(event.name, event.arguments, event.reason, event.always)
        self.approvals.answer(event.call_id, reply.answer, reply.feedback)
