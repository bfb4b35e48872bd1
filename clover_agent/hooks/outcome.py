"""How one hook run counts (docs/hooks.md, "What a hook says"): blocking (exit 2, stderr the
reason), a success with its JSON, or a failure that is named and changes nothing; and a run's event
as a front end shows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clover_agent.events import HookRan
from clover_agent.hooks.config import HookConfig
from clover_agent.hooks.process import Finished
from clover_agent.safe_text import terminal_safe

#: Characters of a hook's reason the model (or a person) reads.
REASON_CHARS = 4000


@dataclass(frozen=True)
class HookRun:
    """One run of ``hook`` as it ended, its stdout's JSON, and why it failed (if it did)."""

    hook: HookConfig
    finished: Finished
    output: dict[str, Any] = field(default_factory=dict)  # stdout as JSON (exit 0), else {}
    failure: str = ""  # why it is a non-blocking failure ("": none)

    @property
    def blocked(self) -> str | None:
        """The reason of an exit 2 (stderr), else None."""
        if self.failure or self.finished.exit_code != 2:
            return None
        return reason_of(self.finished.stderr) or f"blocked by {self.hook.describe()} (exit 2)"

    @property
    def specific(self) -> dict[str, Any]:
        """Its ``hookSpecificOutput`` (empty when it gave none)."""
        found = self.output.get("hookSpecificOutput")
        return found if isinstance(found, dict) else {}


def judge(hook: HookConfig, finished: Finished) -> HookRun:
    """How a run counts: blocking (exit 2), a success with its JSON, or a named failure."""
    if finished.error:
        return HookRun(hook, finished, failure=finished.error)
    if finished.timed_out:
        return HookRun(
            hook, finished, failure=f"timed out after {hook.timeout_s:g} s: killed, outcome unchanged"
        )
    if finished.exit_code == 2:
        return HookRun(hook, finished)
    if finished.exit_code != 0:
        why = reason_of(finished.stderr)[:300]
        return HookRun(hook, finished, failure=f"exit {finished.exit_code}" + (f": {why}" if why else ""))
    text = finished.stdout.strip()
    if not text.startswith("{"):
        return HookRun(hook, finished)  # plain text: no decision
    try:
        output = json.loads(text)
    except ValueError as exc:
        return HookRun(hook, finished, failure=f"its output is not valid JSON ({exc}): ignored")
    if not isinstance(output, dict):
        return HookRun(hook, finished, failure="its JSON output is not an object: ignored")
    return HookRun(hook, finished, output)


def legacy(decision: Any) -> str | None:
    """Claude Code's older top-level ``decision`` (approve/block) in today's words."""
    return {"block": "deny", "deny": "deny", "approve": "allow", "allow": "allow"}.get(str(decision))


def reason_of(text: str) -> str:
    """A hook's words as the model or a person reads them: trimmed, control characters shown."""
    text = text.strip()
    cut = f"\n[... {len(text) - REASON_CHARS} more characters]" if len(text) > REASON_CHARS else ""
    return terminal_safe(text[:REASON_CHARS], workflow_commands=False) + cut


def hook_line(event: HookRan) -> str | None:
    """What a front end shows of a hook's run, on one line made inert for a terminal: a failure
    (always: it is named), or a decision that changed something; None for a quiet success."""
    if not event.failed and event.decided == "ok":
        return None
    tool = f" on {event.tool}" if event.tool else ""
    what = "failed (it changed nothing)" if event.failed else event.decided
    reason = event.reason.splitlines()[0][:300] if event.reason else ""
    text = f"{event.hook_event} hook `{event.command}`{tool}: {what}" + (f": {reason}" if reason else "")
    return terminal_safe(text, single_line=True)
