"""Events only the TUI emits: where a person's request starts, what they undid, the sandbox's state.

They go on the session's bus beside the agent's events, so the session's trajectory holds them and
a resumed session redraws its transcript from that one file. Importing this module registers them
with :func:`clover_agent.events.event_from_dict` (the session store imports it before reading).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from clover_agent.events import Event


@dataclass(frozen=True, kw_only=True)
class SessionStarted(Event):
    """A TUI session begins (or is resumed: ``resumed``), in ``repo`` with that backend and sandbox."""

    type: ClassVar[str] = "tui_session_started"
    session_id: str
    repo: str
    backend: str
    sandbox: str
    policy: str
    context_window: int = 0
    resumed: bool = False


@dataclass(frozen=True, kw_only=True)
class TurnStarted(Event):
    """The person sent request number ``turn`` (1-based); the agent's first model step for it is
    ``first_step`` (the checkpoints of that step and later hold the workspace before it)."""

    type: ClassVar[str] = "tui_turn_started"
    turn: int
    text: str
    first_step: int


@dataclass(frozen=True, kw_only=True)
class TurnsUndone(Event):
    """The workspace went back to how it was before request ``turn``; that request and the later
    ones are undone (the conversation keeps them, with a note saying so)."""

    type: ClassVar[str] = "tui_turns_undone"
    turn: int
    files: list[str] = field(default_factory=list)  # the files the undo changed


@dataclass(frozen=True, kw_only=True)
class SandboxState(Event):
    """The sandbox's state: ``starting``, ``ready``, ``failed`` (with ``message``) or ``closed``."""

    type: ClassVar[str] = "tui_sandbox_state"
    state: str
    kind: str
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Notice(Event):
    """Something for the person to read in the transcript (a command's result, a refusal)."""

    type: ClassVar[str] = "tui_notice"
    text: str
    level: str = "info"  # info | warning | error
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ApprovalNeeded(Event):
    """A call waits for the person's decision (once / always / deny, or deny saying what to do
    instead), with the change it would make (``preview``: a unified diff for an edit, empty when
    there is nothing to show). A resumed session does not ask again: the decision is
    ``ApprovalDecided``."""

    type: ClassVar[str] = "tui_approval_needed"
    call_id: str
    name: str
    arguments: dict[str, Any]
    reason: str
    preview: str = ""
    always: str = ""  # what an "always" answer would allow (``ApprovalRequested.always``)


@dataclass(frozen=True, kw_only=True)
class MessageNotSent(Event):
    """A message the person sent while the agent worked that never reached it: a UserPromptSubmit
    hook blocked it, or the session could not start (``reason``). ``waiting``: the agent still waits
    for a message after an interrupt. The TUI shows it marked, with the reason, and puts it back in
    an empty prompt."""

    type: ClassVar[str] = "tui_message_not_sent"
    text: str
    reason: str
    waiting: bool = False


@dataclass(frozen=True, kw_only=True)
class MessageQueued(Event):
    """A message the person sent while the agent worked (``Agent.send``), once the UserPromptSubmit
    hooks let it through: the agent reads it at its next step, as ``sent`` (``@paths`` resolved, the
    hooks' context added); Esc makes that at once, interrupting the call under way. One the agent did
    not read before its run ended starts the next request."""

    type: ClassVar[str] = "tui_message_queued"
    text: str
    sent: str = ""
