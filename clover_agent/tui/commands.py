"""The session's commands — ``/diff``, ``/apply``, ``/tests``, ``/undo``, ``/policy``, ``/clear`` — as
coroutines the UI runs in the agent thread (``session.run(session.diff())``), and the person's
requests as the session counts them (:class:`Turn`, for ``/undo``).

:class:`SessionCommands` is the part of :class:`~clover_agent.tui.session.TuiSession` that works
on its workspace and conversation once they are up; the session itself (starting, requests,
steering, closing) is in :mod:`clover_agent.tui.session`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clover_agent.agent.policy import Policy
from clover_agent.errors import CloverError
from clover_agent.events import ContextCondensed, Event, TestsRun
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tui.events import Notice, TurnsUndone
from clover_agent.tui.handback import ApplyOutcome, FileChange, Handback, files_differing
from clover_agent.tui.policies import policy_named

if TYPE_CHECKING:
    from clover_agent.agent.loop import Agent
    from clover_agent.sandboxes.base import Sandbox
    from clover_agent.tui.session import SessionStatus


@dataclass
class Turn:
    """One request of the person's, as the session knows it: its first model step is where
    ``/undo`` of it goes back to."""

    turn: int
    text: str
    first_step: int
    undone: bool = False


class SessionCommands:
    """The commands of a :class:`~clover_agent.tui.session.TuiSession` (see the module docstring)."""

    repo: Path
    sandbox: Sandbox | None
    handback: Handback | None
    agent: Agent | None
    policy: Policy
    status: SessionStatus
    system: str
    turns: list[Turn]

    async def _wait_ready(self) -> Agent:
        raise NotImplementedError  # the session's: waits for the sandbox and the agent

    def _emit(self, event: Event) -> None:
        raise NotImplementedError

    async def diff(self) -> str:
        """The workspace's changes since the session started (the sandbox's diff)."""
        await self._wait_ready()
        assert self.sandbox is not None
        return await self.sandbox.diff()

    async def changes(self) -> tuple[str, list[FileChange]]:
        """The files ``/apply`` can hand back now (see :mod:`clover_agent.tui.handback`)."""
        await self._wait_ready()
        assert self.handback is not None
        return await self.handback.changes()

    async def apply(self, snapshot: str, chosen: list[FileChange]) -> ApplyOutcome:
        await self._wait_ready()
        assert self.handback is not None
        outcome = await self.handback.apply(snapshot, chosen)
        if outcome.applied:
            self._emit(
                Notice(
                    text=f"Applied to {self.repo}: {', '.join(outcome.applied)}",
                    data={"applied": outcome.applied},
                )
            )
        for path, why in outcome.refused.items():
            self._emit(Notice(text=f"Not applied: {path} {why}", level="warning"))
        return outcome

    async def run_tests(self, target: str | None) -> TestReport:
        """Run the tests in the sandbox now (``/tests``), recorded as a ``TestsRun`` event."""
        await self._wait_ready()
        assert self.sandbox is not None
        report = await run_tests_in(self.sandbox, target)
        self._emit(TestsRun(phase="user", target=target or "", report=report.to_dict()))
        return report

    async def undoable(self) -> list[Turn]:
        """The requests whose changes can be undone now (newest first): those with a snapshot of
        the workspace before them (a resumed session's earlier ones too, when they were rebuilt)."""
        checkpoints = self.agent.checkpoints if self.agent is not None else None
        if checkpoints is None:
            return []
        return [t for t in reversed(self.turns) if not t.undone and checkpoints.can_undo_to(t.first_step)]

    async def undo(self, turn: int) -> list[str]:
        """Put the workspace back as it was before request ``turn`` (``Agent.undo`` of its first
        step, which tells the model); the files that changed."""
        agent = await self._wait_ready()
        target = next((t for t in self.turns if t.turn == turn), None)
        if target is None:
            raise CloverError(f"there is no request {turn}")
        if agent.steering.busy:
            raise CloverError("the agent is working; interrupt it (Esc) before undoing")
        assert self.sandbox is not None
        before = await self.sandbox.diff()
        if await agent.undo(target.first_step) is None:
            raise CloverError(f"nothing changed in the workspace since request {turn}; nothing to undo")
        files = files_differing(before, await self.sandbox.diff())
        for t in self.turns:
            t.undone |= t.turn >= turn
        self._emit(TurnsUndone(turn=turn, files=files))
        return files

    async def set_policy(self, name: str) -> Policy:
        policy = policy_named(name)
        self.policy = policy
        self.status.policy = policy.name
        if self.agent is not None:
            self.agent.policy = policy
        self._emit(Notice(text=f"Policy is now {policy.name}."))
        return policy

    async def clear(self) -> bool:
        """Start a new conversation (``/clear``); the workspace keeps its changes. Recorded as a
        condensation to the system prompt alone, so a resumed session starts from it too."""
        agent = await self._wait_ready()
        if agent.running:
            raise CloverError("the agent is in the middle of a request; /clear works once it has ended")
        dropped = len(agent.messages)
        agent.messages = [{"role": "system", "content": self.system}]
        self._emit(
            ContextCondensed(
                step=agent.next_step - 1,
                note="the user cleared the conversation (/clear)",
                dropped=[f"{dropped} messages"],
                tokens_before=0,
                tokens_after=0,
                messages=list(agent.messages),
            )
        )
        return True
