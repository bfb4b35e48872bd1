"""One agent carried through a whole TUI conversation: turn after turn, interrupts, approvals, undo.

This is the one place that knows how the agent core is driven interactively, so the rest of the TUI
talks to :class:`AgentDriver` only. Today's core runs one task per :meth:`Agent.run`; the driver
makes a conversation of it:

- a later request continues the same :class:`Agent` with ``run(resume=...)`` over the conversation
  so far plus the new user message (the workspace is already there: nothing is re-applied), with a
  fresh budget per request and step numbers that keep counting (checkpoints are keyed by step);
- an interrupt cancels the running ``run`` (the model call or the tool call it awaits); the calls it
  cut off are answered "interrupted by the user" before the person's correction goes in;
- approvals: each ``ApprovalRequested`` (the core emits it, with the call id, before it waits) is
  shown to the person, and the answer goes back by call id (``Agent.answer_approval``); the core
  remembers "always" for the session per action (``editor:create``) or, for the shell, per exact
  command;
- undo restores the agent's own checkpoint of the request's first step.

The core now has its own seams for the rest too (``Agent.interrupt``, ``send``, ``continue_with``,
``undo``; see docs/architecture.md); the driver's internals can switch to them, its interface stays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.checkpoints import Checkpoint
from clover_agent.agent.loop import Agent, RunResult
from clover_agent.agent.policy import PRESETS, Decision, Policy, Rule
from clover_agent.agent.trajectory import ResumeState
from clover_agent.errors import ExitCode, UsageError
from clover_agent.events import (
    ApprovalRequested,
    ContextCondensed,
    Done,
    Event,
    MessageAdded,
)

#: What the person answers to an approval.
ONCE, ALWAYS, DENY = "once", "always", "deny"
CHOICES = (ONCE, ALWAYS, DENY)

INTERRUPTED_BY_USER = (
    "This call was interrupted by the user before it finished (its effect on the workspace, if any, "
    "may be partial). Read the user's next message before going on."
)

#: Said to the model in every TUI session, after the repository's system prompt.
INTERACTIVE_NOTE = """

# Working with the user
You are pair-programming with a person in a terminal. Each of their messages is a request; work on
it with your tools, and when it is done (or you need their answer to go on) call `finish` with your
reply to them. They may interrupt you and correct course: follow their latest message."""


def _mutating_editor_rules(decision: Decision) -> tuple[Rule, ...]:
    commands = ("create", "str_replace", "insert", "undo_edit")
    return tuple(Rule(decision, tool=f"editor:{c}") for c in commands)


#: The TUI's own preset beside the core's: ask before every call that may change the workspace.
ASK_POLICY = Policy(
    "ask",
    (
        Rule(Decision.DENY, tool="*", path="!/workspace/*"),
        *_mutating_editor_rules(Decision.ASK),
        Rule(Decision.ASK, tool="shell"),
    ),
    default=Decision.ALLOW,
)


#: Policies the TUI offers: the core's presets and its own ``ask``.
POLICIES: dict[str, Policy] = {**PRESETS, ASK_POLICY.name: ASK_POLICY}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise UsageError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None


@dataclass
class PendingApproval:
    call_id: str
    name: str
    arguments: dict[str, Any]
    reason: str
    answer: asyncio.Future[str]


#: Builds the approval the UI is shown for a call (its preview diff): (call id, name, args, reason).
AskUser = Callable[[PendingApproval], Awaitable[None]]


class AgentDriver:
    """Runs requests on one :class:`Agent` (see the module docstring). Lives on the agent's loop."""

    def __init__(
        self,
        agent: Agent,
        *,
        system: str,
        make_budget: Callable[[], Budget],
        ask_user: AskUser,
        conversation: list[dict[str, Any]] | None = None,
        steps: int = 0,
        tokens: int = 0,
    ) -> None:
        self.agent = agent
        self.system = system
        self.make_budget = make_budget
        self.ask_user = ask_user
        #: The conversation so far (a resumed session starts with the saved one).
        self.conversation: list[dict[str, Any]] = list(conversation or [])
        self.steps, self.tokens = steps, tokens
        self.pending: dict[str, PendingApproval] = {}
        self._asking: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[RunResult] | None = None
        self._interrupted = False
        if agent.approvals is None:
            agent.approvals = Approvals()
        agent.bus.subscribe(self._observe)

    # -- what the UI calls ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def next_step(self) -> int:
        return self.steps + 1

    async def run_turn(self, text: str) -> RunResult:
        """Run one request to its end (finish, budget, error or interrupt)."""
        if self.busy:
            raise RuntimeError("a request is already running")
        self.agent.budget = self.make_budget()
        self._interrupted = False
        user = {"role": "user", "content": text}
        if not self.conversation and self.steps == 0:  # the first request of a new session
            work = self.agent.run(text, self.system)
        else:
            opening = [] if self.conversation else [{"role": "system", "content": self.system}]
            messages = [*self.conversation, *self._close_cut_off_calls(), *opening, user]
            for message in (*opening, user):
                self.agent.bus.emit(MessageAdded(message=message))
            state = ResumeState(
                self.agent.run_id, text, messages=messages, steps=self.steps, tokens=self.tokens
            )
            work = self.agent.run(text, "", resume=state, fresh_budget=True)
        self._task = asyncio.ensure_future(work)
        try:
            return await self._task
        except asyncio.CancelledError:
            if not self._interrupted:  # the session itself is being closed
                raise
            return RunResult("interrupted", ExitCode.INTERRUPTED, "interrupted by the user")
        finally:
            self.conversation = list(self.agent.messages)
            self._task = None
            for pending in self.pending.values():
                if not pending.answer.done():
                    pending.answer.cancel()
            self.pending.clear()

    def interrupt(self) -> bool:
        """Stop the running request now (its model call or tool call); False when none runs."""
        if not self.busy:
            return False
        self._interrupted = True
        assert self._task is not None
        self._task.cancel()
        return True

    def answer(self, call_id: str, choice: str) -> bool:
        """Answer the approval of ``call_id``; False when it no longer waits."""
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {CHOICES}")
        pending = self.pending.get(call_id)
        if pending is None or pending.answer.done():
            return False
        pending.answer.set_result(choice)
        return True

    def add_note(self, text: str) -> None:
        """Put a user message into the conversation without running the agent (e.g. after undo)."""
        if self.busy:
            raise RuntimeError("the agent is working; the note would be lost")
        message = {"role": "user", "content": text}
        self.conversation.append(message)
        self.agent.bus.emit(MessageAdded(message=message))

    def forget(self) -> None:
        """Start a new conversation (``/clear``); the workspace keeps its changes. Recorded as a
        condensation to nothing, so a resumed session starts from the same empty conversation."""
        if self.busy:
            raise RuntimeError("the agent is working")
        self.agent.bus.emit(
            ContextCondensed(
                step=self.steps,
                note="the user cleared the conversation (/clear)",
                dropped=[f"{len(self.conversation)} messages"],
                tokens_before=0,
                tokens_after=0,
                messages=[],
            )
        )
        self.conversation = []

    async def undo_to_step(self, step: int) -> Checkpoint | None:
        """Put the workspace back as it was when model step ``step`` began (None: nothing changed
        since then)."""
        if self.busy:
            raise RuntimeError("the agent is working")
        if self.agent.checkpoints is None:
            return None
        return await self.agent.checkpoints.undo_to(step)

    def can_undo_to_step(self, step: int) -> bool:
        return self.agent.checkpoints is not None and self.agent.checkpoints.at_turn(step) is not None

    # -- internals -----------------------------------------------------------------------------------

    def _observe(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)
        elif isinstance(event, Done):
            self.steps = int(event.stats.get("steps", self.steps))
            self.tokens = int(event.stats.get("tokens", self.tokens))

    async def _ask(self, event: ApprovalRequested) -> None:
        """Show the request to the person and hand their answer to the agent by call id."""
        pending = PendingApproval(
            event.call_id,
            event.name,
            event.arguments,
            event.reason,
            asyncio.get_running_loop().create_future(),
        )
        self.pending[event.call_id] = pending
        try:
            await self.ask_user(pending)
            choice = await pending.answer
        except asyncio.CancelledError:  # the request ended (interrupted) before an answer came
            return
        finally:
            self.pending.pop(event.call_id, None)
        self.agent.answer_approval(event.call_id, choice)

    def _close_cut_off_calls(self) -> list[dict[str, Any]]:
        """Results for the calls of the last assistant turn that an interrupt left unanswered."""
        last = next(
            (m for m in reversed(self.conversation) if m.get("role") == "assistant"),
            None,
        )
        if last is None:
            return []
        index = max(i for i, m in enumerate(self.conversation) if m is last)
        answered = {m.get("tool_call_id") for m in self.conversation[index + 1 :] if m.get("role") == "tool"}
        closing = []
        for call in last.get("tool_calls") or []:
            if call["id"] not in answered:
                message = {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["function"]["name"],
                    "content": INTERRUPTED_BY_USER,
                }
                closing.append(message)
                self.agent.bus.emit(MessageAdded(message=message))
        return closing
