"""The agent's events as ACP ``session/update`` notifications.

:class:`UpdateMaker` is fed every event of a session's bus, in order, and returns the updates to
send: the model's reasoning as thought chunks and its text as message chunks while they stream
(the tool-call markup left out: each call is a tool call of its own), each tool call with its kind
(``read``, ``edit``, ``execute``, ``search``, ``think``), its status as it runs, a running
command's latest output as its content (``ToolOutput``, the tail), and its content when it ends (an edit's diff as ACP diff content, a command's output and a test table as text),
and the tokens used after each model call. Paths are shown as the user's (the repository's), not
the sandbox's. A command whose output goes to a client terminal (``terminals``) has that terminal
as its content instead of text.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, cast

from acp import (
    plan_entry,
    schema,
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    tool_terminal_ref,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
)

from clover_agent.agent.plan import Plan
from clover_agent.events import (
    CallInterrupted,
    Event,
    ModelDelta,
    ModelResponded,
    PlanUpdated,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
)
from clover_agent.protocol.messages import TOOL_CALL_OPEN
from clover_agent.sandboxes.base import WORKSPACE
from clover_agent.session.events import TurnStarted

Update = Any  # one of the SDK's session update models
#: A tool's output shown in the editor at most (the trajectory keeps all of it).
MAX_SHOWN_CHARS = 64 * 1024
#: The end of a running command's output shown while it runs (each update replaces the last).
LIVE_SHOWN_CHARS = 8 * 1024

#: ACP tool kinds by tool action (``Tool.action``); other tools are "other".
KINDS: dict[str, schema.ToolKind] = {
    "editor:view": "read",
    "editor:create": "edit",
    "editor:str_replace": "edit",
    "editor:insert": "edit",
    "editor:undo_edit": "edit",
    "search": "search",
    "shell": "execute",
    "run_tests": "execute",
    "finish": "think",
    "propose_plan": "think",
    "update_plan": "think",
}


def action_of(name: str, arguments: dict[str, Any]) -> str:
    command = arguments.get("command")
    return f"editor:{command}" if name == "editor" and isinstance(command, str) else name


def kind_of(name: str, arguments: dict[str, Any]) -> schema.ToolKind:
    return KINDS.get(action_of(name, arguments), "other")


def _shorten(text: str, limit: int = 80) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class UpdateMaker:
    """The updates of one session (see the module docstring); ``repo`` is the user's repository."""

    def __init__(self, repo: Path, context_window: int = 0) -> None:
        self.repo = repo
        self.context_window = context_window
        self._pending: dict[int, str] = {}  # step -> streamed text not sent yet (may open a call)
        self._cut: set[int] = set()  # steps whose text reached a tool call: the rest is the call
        self._streamed: set[int] = set()  # steps that streamed anything
        self._calls: dict[str, tuple[str, dict[str, Any]]] = {}  # call id -> (name, arguments)
        self._live: dict[str, str] = {}  # call id -> the tail of what it printed so far
        self._said: object = None  # what the last message text of this request came from (a step)
        #: Call id -> the client terminal its output is shown in (``terminals``): no text for it.
        self.terminals: dict[str, str] = {}

    def host_path(self, path: str) -> str:
        """A sandbox path as the user's path (a path outside the workspace stays as it is)."""
        clean = posixpath.normpath(path)
        if clean == WORKSPACE or clean.startswith(WORKSPACE + "/"):
            return str(self.repo / clean[len(WORKSPACE) :].lstrip("/"))
        return path

    def shown(self, text: str) -> str:
        """Text with sandbox paths written as the user's."""
        return text.replace(WORKSPACE + "/", str(self.repo) + "/")

    def title(self, name: str, arguments: dict[str, Any]) -> str:
        action = action_of(name, arguments)
        path = arguments.get("path")
        where = self.host_path(path) if isinstance(path, str) else ""
        where = str(Path(where).relative_to(self.repo)) if where.startswith(str(self.repo) + "/") else where
        if action == "editor:view":
            return f"Read {where}"
        if action.startswith("editor:"):
            return f"{action.split(':')[1].replace('_', ' ').capitalize()} {where}".strip()
        if name == "shell":
            return f"Run {_shorten(arguments.get('command', ''))}"
        if name == "search":
            return f"Search {_shorten(arguments.get('pattern') or arguments.get('query') or '')}".strip()
        if name == "run_tests":
            return f"Run tests {arguments.get('target') or ''}".strip()
        if name == "finish":
            return "Finish"
        if name == "propose_plan":
            return "Propose a plan"
        if name == "update_plan":
            return "Update the plan"
        return name

    def _say(self, source: object, text: str) -> Update:
        """A message chunk of ``text``; the first of a new step starts a paragraph of its own, so
        the texts of separate steps never run together."""
        if self._said is not None and self._said != source and not text.startswith("\n"):
            text = "\n\n" + text
        self._said = source
        return update_agent_message_text(text)

    def updates(self, event: Event) -> list[Update]:
        if isinstance(event, TurnStarted):
            self._said = None  # a new request: its answer is a message of its own
            return []
        if isinstance(event, ModelDelta):
            return self._delta(event)
        if isinstance(event, ModelResponded):
            return self._responded(event)
        if isinstance(event, ToolCallStarted):
            return self._started(event)
        if isinstance(event, ToolOutput):
            return self._output(event)
        if isinstance(event, ToolCallFinished):
            return self._finished(event)
        if isinstance(event, PlanUpdated):
            return [plan_update(Plan.from_dict(event.plan))]
        if isinstance(event, CallInterrupted) and event.call_id in self._calls:
            return [update_tool_call(event.call_id, status="failed", content=[_text("Interrupted.")])]
        return []

    def _delta(self, event: ModelDelta) -> list[Update]:
        if not event.text:
            return []
        self._streamed.add(event.step)
        if event.kind == "reasoning":
            return [update_agent_thought_text(event.text)]
        if event.kind != "text" or event.step in self._cut:
            return []
        pending = self._pending.get(event.step, "") + event.text
        at = pending.find(TOOL_CALL_OPEN)
        if at >= 0:
            self._cut.add(event.step)
            self._pending.pop(event.step, None)
            send = pending[:at].rstrip()
        else:
            keep = next(
                (n for n in range(min(len(pending), len(TOOL_CALL_OPEN) - 1), 0, -1)
                 if TOOL_CALL_OPEN.startswith(pending[-n:])),
                0,
            )  # fmt: skip
            send, self._pending[event.step] = pending[: len(pending) - keep], pending[len(pending) - keep :]
        return [self._say(event.step, self.shown(send))] if send else []

    def _responded(self, event: ModelResponded) -> list[Update]:
        out: list[Update] = []
        rest = self._pending.pop(event.step, "")
        if event.step not in self._streamed:  # a backend that does not stream: the turn at once
            if event.reasoning:
                out.append(update_agent_thought_text(event.reasoning))
            if event.content.strip():
                out.append(self._say(event.step, self.shown(event.content)))
        elif event.step not in self._cut and rest.strip():
            out.append(self._say(event.step, self.shown(rest)))
        if self.context_window:
            used = min(event.prompt_tokens + event.completion_tokens, self.context_window)
            out.append(schema.UsageUpdate(session_update="usage_update", used=used, size=self.context_window))
        return out

    def _locations(self, arguments: dict[str, Any]) -> list[schema.ToolCallLocation] | None:
        path = arguments.get("path")
        if not isinstance(path, str) or not path:
            return None
        line = arguments.get("view_range") or arguments.get("insert_line")
        first = line[0] if isinstance(line, list) and line and isinstance(line[0], int) else line
        return [
            schema.ToolCallLocation(path=self.host_path(path), line=first if isinstance(first, int) else None)
        ]

    def _started(self, event: ToolCallStarted) -> list[Update]:
        self._calls[event.call_id] = (event.name, event.arguments)
        out: list[Update] = [
            start_tool_call(
                event.call_id,
                self.title(event.name, event.arguments),
                kind=kind_of(event.name, event.arguments),
                status="in_progress",
                locations=self._locations(event.arguments),
                raw_input=event.arguments,
            )
        ]
        if event.name == "finish" and str(event.arguments.get("summary", "")).strip():
            out.append(self._say(("finish", event.step), self.shown(str(event.arguments["summary"]))))
        return out

    def _output(self, event: ToolOutput) -> list[Update]:
        if event.call_id not in self._calls or not event.text or event.call_id in self.terminals:
            return []
        tail = (self._live.get(event.call_id, "") + event.text)[-LIVE_SHOWN_CHARS:]
        self._live[event.call_id] = tail
        return [update_tool_call(event.call_id, content=[_text(f"```\n{self.shown(tail)}\n```")])]

    def _finished(self, event: ToolCallFinished) -> list[Update]:
        self._live.pop(event.call_id, None)
        if event.call_id not in self._calls:
            return []
        name, arguments = self._calls.pop(event.call_id)
        terminal = self.terminals.pop(event.call_id, None)
        return [
            update_tool_call(
                event.call_id,
                status="failed" if event.is_error else "completed",
                content=[tool_terminal_ref(terminal)] if terminal else self.content(name, arguments, event),
                raw_output={"output": event.output[:MAX_SHOWN_CHARS], "is_error": event.is_error},
            )
        ]

    def content(self, name: str, arguments: dict[str, Any], event: ToolCallFinished) -> list[Any]:
        """What the editor shows of a finished call."""
        data = event.data or {}
        action = action_of(name, arguments)
        if action.startswith("editor:") and action != "editor:view" and not event.is_error and "path" in data:
            new = data.get("new_content")
            old = data.get("old_content")
            return [tool_diff_content(self.host_path(str(data["path"])), new or "", old)]
        if name == "run_tests" and isinstance(data.get("report"), dict):
            return [_text(tests_table(data["report"]))]
        if name == "finish":
            return []
        output = event.full_output or event.output
        if len(output) > MAX_SHOWN_CHARS:
            output = output[:MAX_SHOWN_CHARS] + f"\n… ({len(output) - MAX_SHOWN_CHARS} more characters)"
        text = self.shown(output)
        return [_text(f"```\n{text}\n```" if name in ("shell", "search") and text.strip() else text)]


def plan_update(plan: Plan) -> schema.AgentPlanUpdate:
    """A plan as the editor shows it: its steps, each with its status (ACP's are the plan's)."""
    return update_plan(plan_entry(s.step, status=cast(Any, s.status)) for s in plan.steps)


def _text(text: str) -> schema.ContentToolCallContent:
    return tool_content(text_block(text))


def tests_table(report: dict[str, Any]) -> str:
    """A test run as a Markdown table of its counts, and its failing tests."""
    counts = [(key, report.get(key, 0)) for key in ("passed", "failed", "errors", "skipped")]
    lines = ["| " + " | ".join(k for k, _ in counts) + " |", "|" + "---|" * len(counts)]
    lines.append("| " + " | ".join(str(v) for _, v in counts) + " |")
    failing = [t for t, outcome in (report.get("outcomes") or {}).items() if outcome in ("failed", "error")]
    if failing:
        lines += ["", "Failing:", *(f"- `{t}`" for t in failing[:50])]
    if report.get("problem"):
        lines += ["", str(report["problem"])]
    return "\n".join(lines)
