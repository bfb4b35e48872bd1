"""``/export``: a session's transcript as Markdown, written from its events (the trajectory).

Requests, the agent's replies, its reasoning (in a ``<details>`` block), each tool call with its
arguments and full output, test runs, undos, plans (proposed, approved, steps done) and the end of
each request, in order.
"""

from __future__ import annotations

import json

from clover_agent.agent.plan import Plan
from clover_agent.events import (
    ApprovalDecided,
    Done,
    ErrorReported,
    Event,
    HookRan,
    ModelResponded,
    PlanUpdated,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.hooks import hook_line
from clover_agent.session.events import SessionStarted, TurnStarted, TurnsUndone


def _fence(text: str, language: str = "") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    longest = 0
    current = 0
    for char in text:
        current = current + 1 if char == "`" else 0
        longest = max(longest, current)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}"


def transcript_markdown(events: list[Event]) -> str:
    """The Markdown transcript of ``events`` (see the module docstring)."""
    out: list[str] = []
    calls: dict[str, ToolCallStarted] = {}
    for event in events:
        if isinstance(event, SessionStarted):
            out.append(
                f"# clover-agent session {event.session_id}\n\n{event.repo} · {event.backend} · "
                f"{event.sandbox} sandbox · policy {event.policy}"
            )
        elif isinstance(event, TurnStarted):
            out.append(f"## Request {event.turn}\n\n{event.text}")
        elif isinstance(event, ModelResponded):
            if event.reasoning and event.reasoning.strip():
                out.append(f"<details><summary>Thinking</summary>\n\n{event.reasoning.strip()}\n\n</details>")
            if event.content.strip():
                out.append(event.content.strip())
        elif isinstance(event, ToolCallStarted):
            calls[event.call_id] = event
        elif isinstance(event, ToolCallFinished):
            started = calls.get(event.call_id)
            arguments = json.dumps(started.arguments if started else {}, indent=2, ensure_ascii=False)
            mark = "failed" if event.is_error else "ok"
            out.append(
                f"**{event.name}** ({mark}, {event.duration_s:.1f} s)\n\n{_fence(arguments, 'json')}\n\n"
                + _fence(event.full_output or event.output)
            )
        elif isinstance(event, ApprovalDecided):
            verdict = "allowed" if event.approved else "denied"
            said = f": “{event.feedback}”" if event.feedback else ""
            out.append(f"*{event.name} {verdict} by {event.decided_by}{said}*")
        elif isinstance(event, TestsRun):
            report = event.report
            out.append(
                f"**tests** `{event.target or 'all'}`: {report.get('passed', 0)} passed, "
                f"{report.get('failed', 0)} failed, {report.get('errors', 0)} errors, "
                f"{report.get('skipped', 0)} skipped"
            )
        elif isinstance(event, PlanUpdated):
            plan = Plan.from_dict(event.plan)
            if event.stage == "progress":
                out.append(f"*Plan: {plan.done}/{len(plan.steps)} steps done*")
            else:
                out.append(f"**Plan {event.stage}**\n\n{_fence(plan.markdown(), 'markdown')}")
        elif isinstance(event, TurnsUndone):
            files = ", ".join(event.files) or "no file"
            out.append(f"*Undone: request {event.turn} and later ({files} put back)*")
        elif isinstance(event, ErrorReported) and not event.fatal:
            out.append(f"> {event.kind}: {event.message}")
        elif isinstance(event, HookRan) and (line := hook_line(event)) is not None:
            out.append(f"> hook: {line}")
        elif isinstance(event, Done) and event.outcome != "answered":  # the answer is the text above
            text = event.summary or event.message
            out.append(f"*{event.outcome.replace('_', ' ')}:* {text}")
    return "\n\n".join(out) + "\n"
