"""A TUI session without the UI: its sandbox, backend and agent, in an :class:`AgentThread`.

Everything slow — starting the sandbox, loading and running the model, tools, git — happens in
that thread, so the UI's event loop only ever draws. The UI calls the session's methods from its
own thread; each returns a :class:`concurrent.futures.Future` it can await with
``asyncio.wrap_future``. Every event of the session — the agent's and the TUI's own
(:mod:`clover_agent.tui.events`) — goes to the trajectory of the session folder first, then to
``deliver`` (the app posts it to itself; Textual's ``post_message`` is thread-safe).

The sandbox starts as soon as the session does, while the person types; a request sent before it
is ready waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from clover_agent.agent.budget import Budget
from clover_agent.agent.checkpoints import CheckpointError, restore_workspace
from clover_agent.agent.loop import Agent
from clover_agent.agent.policy import Policy
from clover_agent.agent.system_prompt import gather_facts, system_prompt
from clover_agent.agent.trajectory import TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, message_of
from clover_agent.events import Event, EventBus, TestsRun, WorkspaceChanged
from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes import SandboxSpec, create_sandbox
from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.settings import Settings
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tui.agent_thread import AgentThread
from clover_agent.tui.driver import INTERACTIVE_NOTE, AgentDriver, PendingApproval, policy_named
from clover_agent.tui.events import (
    ApprovalNeeded,
    MessageQueued,
    Notice,
    SandboxState,
    SessionStarted,
    TurnStarted,
    TurnsUndone,
)
from clover_agent.tui.handback import ApplyOutcome, FileChange, Handback, files_differing
from clover_agent.tui.preview import edit_preview
from clover_agent.tui.store import SavedSession, SessionInfo, new_session_id, session_dir, write_info

T = TypeVar("T")

_MENTION = re.compile(r"(?<![\w/])@([\w./-]+)")


@dataclass
class SessionOptions:
    """What a session runs with (the same choices as ``fix``, per request where they are budgets)."""

    repo: Path
    make_backend: Callable[[], ModelBackend]
    sandbox_kind: str = "docker"
    spec: SandboxSpec | None = None  # default: the repository as the settings say (launch.sandbox_spec)
    policy: str = "workspace"
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    resume: SavedSession | None = None


@dataclass
class Turn:
    """One request of the person's, as the session knows it."""

    turn: int
    text: str
    first_step: int
    undone: bool = False


@dataclass
class SessionStatus:
    """What the status bar needs that the events do not carry."""

    backend: str = ""
    context_window: int = 0
    sandbox: str = "starting"
    policy: str = ""
    limits: dict[str, Any] = field(default_factory=dict)


class TuiSession:
    """See the module docstring. ``deliver`` is called (in the agent thread) with every event."""

    def __init__(self, options: SessionOptions, deliver: Callable[[Event], None]) -> None:
        self.options = options
        self.repo = options.repo
        saved = options.resume
        self.session_id = saved.info.session_id if saved else new_session_id()
        self.folder = session_dir(self.repo, self.session_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.info = (
            saved.info if saved else SessionInfo(self.session_id, str(self.repo), created=now, updated=now)
        )
        self.turns: list[Turn] = [
            Turn(e.turn, e.text, e.first_step)
            for e in (saved.events if saved else [])
            if isinstance(e, TurnStarted)
        ]
        for event in saved.events if saved else []:
            if isinstance(event, TurnsUndone):
                for turn in self.turns:
                    turn.undone |= turn.turn >= event.turn
        self.policy = policy_named(options.policy)
        self.status = SessionStatus(policy=self.policy.name)
        self.bus = EventBus()
        self._writer = TrajectoryWriter(self.folder / "trajectory.jsonl")
        self.bus.subscribe(self._writer)
        self.bus.subscribe(deliver)
        self.thread = AgentThread()
        self.backend: ModelBackend | None = None
        self.sandbox: Sandbox | None = None
        self.driver: AgentDriver | None = None
        self.handback: Handback | None = None
        self.queue: list[str] = []
        self._ready: asyncio.Future[bool] | None = None
        self._sending = False
        self._start_task: asyncio.Task[None] | None = None
        self.thread.submit(self._start())

    # -- the UI's side (thread-safe) ---------------------------------------------------------------

    def run(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run one of the session's coroutines in the agent thread."""
        return self.thread.submit(work)

    def send(self, text: str) -> concurrent.futures.Future[None]:
        return self.run(self._send(text))

    def interrupt(self) -> None:
        self.thread.call(self._interrupt)

    def answer(self, call_id: str, choice: str) -> None:
        self.thread.call(self._answer, call_id, choice)

    def close(self, timeout: float = 30.0) -> None:
        """End the session: stop the agent, remove the sandbox, close the trajectory (blocking,
        at most about ``timeout`` seconds)."""
        try:
            self.run(self._close()).result(timeout=timeout)
        except (concurrent.futures.TimeoutError, *RUN_ERRORS, OSError, RuntimeError):
            pass
        finally:
            self.thread.stop()

    # -- in the agent thread -----------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self.bus.emit(event)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._start_task = asyncio.current_task()
        saved = self.options.resume
        try:
            self.backend = self.options.make_backend()
        except RUN_ERRORS as exc:
            self._emit(Notice(text=f"The model backend cannot start: {message_of(exc)}", level="error"))
            self._ready.set_result(False)
            return
        self.status.backend, self.status.context_window = self.backend.name, self.backend.context_window
        self.status.limits = Budget(
            self.options.max_steps, self.options.max_time_s, self.options.max_tokens
        ).limits()
        self.info.backend = self.backend.name
        self._emit(
            SessionStarted(
                session_id=self.session_id,
                repo=str(self.repo),
                backend=self.backend.name,
                sandbox=self.options.sandbox_kind,
                policy=self.policy.name,
                context_window=self.backend.context_window,
                resumed=saved is not None,
            )
        )
        self._sandbox_state("starting")
        spec = self.options.spec or sandbox_spec(Settings.load(), self.repo)
        try:
            self.sandbox = create_sandbox(self.options.sandbox_kind, spec)
            await self.sandbox.start()
            self.handback = Handback(self.sandbox, self.repo, self.folder, self.session_id)
            await self.handback.start()
            if saved is not None and saved.state is not None and saved.state.patch.strip():
                try:
                    await restore_workspace(self.sandbox, saved.state.patch)
                except CheckpointError as exc:
                    self._emit(
                        Notice(
                            text=f"The saved session's changes could not be restored ({exc.message}); "
                            "the workspace is your working tree as it is now.",
                            level="warning",
                        )
                    )
            facts = await gather_facts(self.sandbox)
        except RUN_ERRORS as exc:
            self._sandbox_state("failed", message_of(exc))
            self._ready.set_result(False)
            return
        agent = Agent(self.backend, self.sandbox, self.bus, run_id=self.session_id, policy=self.policy)
        state = saved.state if saved else None
        self.driver = AgentDriver(
            agent,
            system=system_prompt(facts) + INTERACTIVE_NOTE,
            make_budget=lambda: Budget(
                self.options.max_steps, self.options.max_time_s, self.options.max_tokens
            ),
            ask_user=self._ask_user,
            conversation=state.messages if state else None,
            steps=state.steps if state else 0,
            tokens=state.tokens if state else 0,
        )
        self._sandbox_state("ready", self.sandbox.warning or "")
        self._ready.set_result(True)

    def _sandbox_state(self, state: str, message: str = "") -> None:
        self.status.sandbox = state
        self._emit(SandboxState(state=state, kind=self.options.sandbox_kind, message=message))

    async def _wait_ready(self) -> AgentDriver:
        assert self._ready is not None
        if not await asyncio.shield(self._ready) or self.driver is None:
            raise CloverError("the session cannot work: the sandbox or the model backend did not start")
        return self.driver

    def mention_paths(self, text: str) -> str:
        """``@path`` of a file in the repository becomes its path in the sandbox."""

        def replace(match: re.Match[str]) -> str:
            path = match.group(1).rstrip(".")
            tail = match.group(1)[len(path) :]
            if (self.repo / path).exists() and ".." not in path.split("/"):
                return f"{WORKSPACE}/{path}{tail}"
            return match.group(0)

        return _MENTION.sub(replace, text)

    async def _send(self, text: str) -> None:
        if self._sending:
            self.queue.append(text)
            self._emit(MessageQueued(text=text))
            return
        self._sending = True
        try:
            pending: str | None = text
            while pending is not None:
                await self._turn(pending)
                pending = self.queue.pop(0) if self.queue else None
        finally:
            self._sending = False

    async def _turn(self, text: str) -> None:
        saved = self.options.resume.state if self.options.resume else None
        first_step = self.driver.next_step if self.driver else (saved.steps if saved else 0) + 1
        turn = Turn(len(self.turns) + 1, text, first_step)
        self.turns.append(turn)
        self._emit(TurnStarted(turn=turn.turn, text=text, first_step=turn.first_step))
        self.info.title = self.info.title or " ".join(text.split())[:80]
        self.info.requests = len(self.turns)
        self._save_info()
        if self.driver is None and self.status.sandbox == "starting":
            self._emit(Notice(text="Waiting for the sandbox to start…"))
        try:
            driver = await self._wait_ready()
        except CloverError as exc:
            self._emit(Notice(text=exc.message, level="error"))
            return
        try:
            await driver.run_turn(self.mention_paths(text))
        finally:
            self._save_info()

    def _save_info(self) -> None:
        self.info.updated = time.time()
        write_info(self.folder, self.info)

    def _interrupt(self) -> None:
        if self.driver is not None and self.driver.interrupt():
            self._emit(Notice(text="Interrupted. Type a correction or a new request.", level="warning"))

    def _answer(self, call_id: str, choice: str) -> None:
        if self.driver is not None:
            self.driver.answer(call_id, choice)

    async def _ask_user(self, pending: PendingApproval) -> None:
        preview = ""
        if self.sandbox is not None:
            try:
                preview = await edit_preview(self.sandbox, pending.name, pending.arguments)
            except (*RUN_ERRORS, OSError):
                preview = ""
        self._emit(
            ApprovalNeeded(
                call_id=pending.call_id,
                name=pending.name,
                arguments=pending.arguments,
                reason=pending.reason,
                preview=preview,
            )
        )

    async def _close(self) -> None:
        starting = self._start_task
        if starting is not None and not starting.done():  # closed while the sandbox starts
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(False)
        if self.driver is not None and self.driver.busy:
            self.driver.interrupt()
            await asyncio.sleep(0)
        try:
            if self.backend is not None:
                await self.backend.close()
        finally:
            if self.sandbox is not None:
                await self.sandbox.close()
                self._sandbox_state("closed")
            await self.bus.drain()
            self._writer.close()

    # -- commands (coroutines for :meth:`run`) -----------------------------------------------------

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
        """The requests whose changes can be undone now (newest first)."""
        if self.driver is None:
            return []
        return [
            t for t in reversed(self.turns) if not t.undone and self.driver.can_undo_to_step(t.first_step)
        ]

    async def undo(self, turn: int) -> list[str]:
        """Put the workspace back as it was before request ``turn``; the files that changed."""
        driver = await self._wait_ready()
        if driver.busy:
            raise CloverError("the agent is working; interrupt it (Esc) before undoing")
        target = next((t for t in self.turns if t.turn == turn), None)
        if target is None:
            raise CloverError(f"there is no request {turn}")
        assert self.sandbox is not None
        before = await self.sandbox.diff()
        if await driver.undo_to_step(target.first_step) is None:
            raise CloverError(f"nothing changed in the workspace since request {turn}; nothing to undo")
        after = await self.sandbox.diff()
        files = files_differing(before, after)
        for t in self.turns:
            t.undone |= t.turn >= turn
        self._emit(TurnsUndone(turn=turn, files=files))
        self._emit(WorkspaceChanged(step=driver.steps, call_id=f"undo-{turn}", patch=after))
        quoted = " ".join(target.text.split())[:80]
        driver.add_note(
            f"I undid the changes made since my request {turn} ({quoted!r}): the workspace is back as it "
            f"was before it{' (files put back: ' + ', '.join(files) + ')' if files else ''}. "
            "Do not redo them unless I ask."
        )
        return files

    async def set_policy(self, name: str) -> Policy:
        policy = policy_named(name)
        self.policy = policy
        self.status.policy = policy.name
        if self.driver is not None:
            self.driver.agent.policy = policy
        self._emit(Notice(text=f"Policy is now {policy.name}."))
        return policy

    async def clear(self) -> bool:
        driver = await self._wait_ready()
        driver.forget()
        return True
