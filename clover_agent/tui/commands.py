"""The session's commands — ``/diff``, ``/apply``, ``/tests``, ``/undo``, ``/policy``, ``/clear`` — as
coroutines the UI runs in the agent thread (``session.run(session.diff())``), and the person's
requests as the session counts them (:class:`Turn`, for ``/undo``).

:class:`SessionCommands` is the part of :class:`~clover_agent.tui.session.TuiSession` that works
on its workspace and conversation once they are up; the session itself (starting, requests,
steering, closing) is in :mod:`clover_agent.tui.session`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.agent.policy import Policy
from clover_agent.errors import CloverError
from clover_agent.events import ContextCondensed, Event, TestsRun
from clover_agent.handback.apply import PatchNotApplied
from clover_agent.handback.session import Offer, SessionHandBack
from clover_agent.handback.snapshot import left_out_lines
from clover_agent.session.events import Notice, TurnsUndone
from clover_agent.session.store import SessionInfo
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tui.handback import ApplyOutcome, files_differing
from clover_agent.tui.policies import policy_named

if TYPE_CHECKING:
    from clover_agent.agent.loop import Agent
    from clover_agent.sandboxes.base import Sandbox


@dataclass
class SessionStatus:
    """What the status bar needs that the events do not carry."""

    backend: str = ""
    context_window: int = 0
    sandbox: str = "starting"
    policy: str = ""
    limits: dict[str, Any] = field(default_factory=dict)


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
    handback: SessionHandBack | None
    agent: Agent | None
    policy: Policy
    status: SessionStatus
    system: str
    turns: list[Turn]
    info: SessionInfo
    applied: set[str]  # the files an /apply of this session wrote into the tree
    planning: bool  # plan mode: requests go to the agent read-only until a plan is approved

    async def _wait_ready(self) -> Agent:
        raise NotImplementedError  # the session's: waits for the sandbox and the agent

    def _save_info(self) -> None:
        raise NotImplementedError  # the session's: writes session.json

    def _emit(self, event: Event) -> None:
        raise NotImplementedError

    async def diff(self) -> str:
        """The session's changes that your tree does not hold yet (since the start or the last
        apply), read on the host as ``/apply`` reads them: no git inside the sandbox shapes them."""
        await self._wait_ready()
        assert self.handback is not None
        return await self.handback.diff()

    async def unapplied(self) -> list[str]:
        """The files changed in the session that your tree does not hold yet ([] before the sandbox
        is up: nothing can have changed)."""
        if self.handback is None or self.sandbox is None:
            return []
        return await self.handback.pending()

    async def changes(self) -> list[Offer]:
        """What ``/apply`` offers now, judged as ``fix`` judges (:mod:`clover_agent.handback.session`):
        one offer, or none when nothing changed since the start or the last apply. The sandbox's
        processes are stopped first, so the agent must not be working."""
        agent = await self._wait_ready()
        if agent.steering.busy:
            raise CloverError("the agent is working; wait for it or interrupt it (Esc) before /apply")
        assert self.handback is not None
        offer = await self.handback.offer()
        return [] if offer is None else [offer]

    async def part(self, offer: Offer, paths: list[str]) -> Offer:
        """The chosen files of ``offer`` on their own, judged again (what is applied is what was
        judged)."""
        await self._wait_ready()
        assert self.handback is not None
        return await self.handback.part(offer, paths)

    async def apply(self, offer: Offer, *, markers: bool = False) -> ApplyOutcome:
        """Write ``offer`` (as judged) into the working tree, all at once, merged with your edits
        made since (``markers``: where the agent's change overlaps yours, both between conflict
        markers; else yours is kept and the overlap named)."""
        await self._wait_ready()
        assert self.handback is not None
        outcome = ApplyOutcome(verdict=offer.verdict)
        try:
            applied, _ = await self.handback.apply(offer, markers=markers)
            outcome.applied = applied.files
        except PatchNotApplied as exc:
            outcome.refused = {path: exc.message for path in offer.patch.files}
            self._emit(
                Notice(text=f"Not applied: {', '.join(offer.patch.files)}: {exc.message}", level="warning")
            )
            return outcome
        self.applied.update(outcome.applied)
        self._emit(
            Notice(
                text=f"Applied to {self.repo}: {', '.join(outcome.applied)} ({offer.verdict})",
                data={"applied": outcome.applied, "verdict": str(offer.judged.verdict)},
            )
        )
        for note in applied.notes():  # merged with your edits, or left out
            self._emit(Notice(text=note, level="warning"))
        left_out = left_out_lines(offer.patch.left_out)
        if left_out:
            self._emit(
                Notice(text="Not applied, left out of the patch: " + "; ".join(left_out), level="warning")
            )
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
        assert self.handback is not None
        before = await self.handback.diff()  # read on the host, as /apply reads the changes
        if await agent.undo(target.first_step) is None:
            raise CloverError(f"nothing changed in the workspace since request {turn}; nothing to undo")
        files = files_differing(before, await self.handback.diff())
        for t in self.turns:
            t.undone |= t.turn >= turn
        self._emit(TurnsUndone(turn=turn, files=files))
        kept = sorted(set(files) & self.applied)
        if kept:  # the tree is the person's: an undo never writes to it
            self._emit(
                Notice(
                    text=f"Your tree keeps what /apply wrote to {', '.join(kept)}: /undo changes the sandbox "
                    "only. The next /apply offers to take it out of your tree (judged as any change).",
                    level="warning",
                )
            )
        return files

    async def set_policy(self, name: str) -> Policy:
        """The session's policy; while planning, the one plan mode goes back to (the agent keeps the
        plan policy until then)."""
        policy = policy_named(name)
        self.policy = policy
        self.status.policy = policy.name
        if self.agent is not None and not self.planning:
            self.agent.policy = policy
        self.info.policy = policy.name
        self._save_info()
        said = f"After plan mode, the policy is {policy.name}." if self.planning else ""
        self._emit(Notice(text=said or f"Policy is now {policy.name}."))
        return policy

    async def set_planning(self, on: bool) -> bool:
        """Plan mode on or off (``/plan``, shift+tab). The agent's policy changes at once, so a request
        under way goes on under the new one from its next call; the plan-mode note goes with each
        request sent while planning. Off: back to the session's policy. Recorded (the notice's
        ``planning``), so the status bar and a resumed session know."""
        if on != self.planning:
            self.planning = on
            if self.agent is not None:
                self.agent.start_planning() if on else self.agent.leave_planning(self.policy)
            text = (
                "Plan mode: the agent reads, searches and runs the tests, then proposes a plan for you to "
                "approve; edits and shell commands are refused until then (shift+tab or /plan leaves it)."
                if on
                else f"Plan mode off: the policy is {self.policy.name}."
            )
            self._emit(Notice(text=text, data={"planning": on}))
        return on

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
