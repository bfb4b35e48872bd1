"""Approvals: the calls the policy says to ``ask`` about, waiting for a person's answer by call id.

The agent emits :class:`~clover_agent.events.ApprovalRequested` (with the call id) and only then
awaits :meth:`Approvals.wait`; a front end answers from its own task with :meth:`Approvals.answer`
(the TUI from a button, ``fix`` from a prompt at the terminal). ``always`` allows this call and every
later one the same policy rule asks about, for the rest of the run; a denial may carry the person's
words (``feedback``: what to do instead), which the model reads with the refusal. An agent given
no :class:`Approvals` has no one to ask: ``ask`` is denied (``decided_by="no-terminal"``).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Hashable
from dataclasses import dataclass


class Answer(enum.StrEnum):
    """A person's answer to an approval request."""

    ONCE = "once"  # allow this call
    ALWAYS = "always"  # allow it and, for the rest of the run, every call the same rule asks about
    DENY = "deny"


@dataclass(frozen=True)
class Reply:
    """An answer and, with a denial, what the person said to do instead ("" when nothing)."""

    answer: Answer
    feedback: str = ""


class Approvals:
    """The open approval requests of one run, answered by call id, and what was allowed always."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[Hashable, asyncio.Future[Reply]]] = {}
        self._always: set[Hashable] = set()

    def allowed_always(self, rule: Hashable) -> bool:
        """Whether an earlier ``always`` answer covers calls that ``rule`` asks about."""
        return rule in self._always

    def open(self, call_id: str, rule: Hashable) -> None:
        """Open the request for ``call_id`` (before it is announced, so an answer that comes at once
        is not lost)."""
        self._waiting[call_id] = (rule, asyncio.get_running_loop().create_future())

    async def wait(self, call_id: str) -> Answer:
        """The answer to the open request for ``call_id`` (removed once answered or cancelled)."""
        return (await self.wait_reply(call_id)).answer

    async def wait_reply(self, call_id: str) -> Reply:
        """The answer to the open request for ``call_id``, with the person's feedback."""
        _, future = self._waiting[call_id]
        try:
            return await future
        finally:
            self._waiting.pop(call_id, None)

    def answer(self, call_id: str, answer: Answer | str, feedback: str = "") -> bool:
        """Answer the request for ``call_id`` (from any task on the agent's event loop); False when no
        request with that id is waiting (already answered, or never asked). ``feedback`` goes with a
        denial only (the model reads it); with an allow it is dropped."""
        entry = self._waiting.get(call_id)
        if entry is None or entry[1].done():
            return False
        rule, future = entry
        answer = Answer(answer)
        if answer is Answer.ALWAYS:
            self._always.add(rule)
        future.set_result(Reply(answer, feedback.strip() if answer is Answer.DENY else ""))
        return True

    @property
    def pending(self) -> list[str]:
        """The call ids waiting for an answer."""
        return [call_id for call_id, (_, future) in self._waiting.items() if not future.done()]
