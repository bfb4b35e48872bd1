"""A TUI session without the UI: its sandbox, backend and agent, in an :class:`AgentThread`.

Everything slow — starting the sandbox, loading and running the model, tools, git — happens in
that thread, so the UI's event loop only ever draws. The UI calls the session's methods from its
own thread; each returns a :class:`concurrent.futures.Future` it can await with
``asyncio.wrap_future``. The session drives one :class:`~clover_agent.agent.loop.Agent` through
its seams (docs/architecture.md, "Steering the agent"); the commands (``/diff``, ``/apply``,
``/undo``, ...) are in :mod:`clover_agent.tui.commands`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.checkpoints import WorkspaceCheckpointError
from clover_agent.agent.loop import Agent, PromptBlocked, RunResult
from clover_agent.agent.plan import Plan
from clover_agent.agent.policy import Policy
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, UsageError, message_of
from clover_agent.events import ApprovalRequested, Done, Event, EventBus, MessageAdded, PlanUpdated
from clover_agent.handback.session import SessionHandBack
from clover_agent.sandboxes.base import Sandbox
from clover_agent.session.assembly import AgentSession, SessionConfig
from clover_agent.session.events import (
    ApprovalNeeded,
    MessageNotSent,
    MessageQueued,
    Notice,
    SandboxState,
    SessionStarted,
    TurnStarted,
    TurnsUndone,
)
from clover_agent.session.store import SavedSession, SessionInfo, new_session_id, session_dir, write_info
from clover_agent.tools.mcp import McpServers
from clover_agent.tui.agent_thread import AgentThread
from clover_agent.tui.commands import SessionCommands, SessionStatus, Turn
from clover_agent.tui.policies import INTERACTIVE_NOTE, policy_named
from clover_agent.tui.preview import edit_preview
from clover_agent.tui.text import sandbox_paths

T = TypeVar("T")
#: Where the session folder keeps the tracebacks of unexpected errors.
ERRORS_FILE = "errors.log"


class TuiSession(SessionCommands):
    """The TUI's session; ``deliver`` is called (in the agent thread) with every event.

    Every event of the session, the agent's and the TUI's own (:mod:`clover_agent.session.events`), goes
    to the trajectory of the session folder first, then to ``deliver`` (the app posts it to itself;
    Textual's ``post_message`` is thread-safe).

    A request starts the agent's ``run`` (the first) or ``continue_with`` (the later ones, and all of a
    resumed session's, which ``Agent.resume`` took up). From the UI:

    - ``send``: a request, or a message typed while the agent works, read at its next step. Each is
      screened by the UserPromptSubmit hooks before the model reads it: a request by the agent's run,
      a message typed while it works here, before it is queued (blocked: ``MessageNotSent``).
    - ``interrupt`` (Esc): the model call or tool call stops; the agent waits for the person's next message.
    - ``answer``: answers an approval (the agent's ``answer_approval``).

    The sandbox starts as soon as the session does, while the person types; a request sent before it is
    ready waits for it.
    """

    def __init__(self, options: SessionConfig, deliver: Callable[[Event], None]) -> None:
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
        self.applied: set[str] = set()
        for event in saved.events if saved else []:
            if isinstance(event, TurnsUndone):
                for turn in self.turns:
                    turn.undone |= turn.turn >= event.turn
            elif isinstance(event, Notice) and isinstance(event.data.get("applied"), list):
                self.applied.update(str(path) for path in event.data["applied"])
        self.policy, self._policy_note = _resumed_policy(options)
        self.planning = _resumed_planning(saved.events if saved else [])
        self.info.policy = self.policy.name
        self.status = SessionStatus(policy=self.policy.name)
        self.bus = EventBus()
        self._writer = TrajectoryWriter(self.folder / TRAJECTORY_FILE, key=options.record_key)
        self.bus.subscribe(self._writer)
        self.bus.subscribe(deliver)
        self.bus.subscribe(self._observe)
        self.thread = AgentThread()
        self.backend: ModelBackend | None = None
        self.sandbox: Sandbox | None = None
        self.mcp: McpServers | None = None
        self.parts: AgentSession | None = None  # the sandbox, the MCP servers and the agent, opened
        self.agent: Agent | None = None
        self.system = ""  # the system prompt of a new conversation (known once the sandbox is up)
        self.handback: SessionHandBack | None = None
        self._ready: asyncio.Future[bool] | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._request: asyncio.Task[RunResult] | None = None  # the agent's run of the request now
        self._working = False  # a request is on its way (waiting for the sandbox) or running
        self._unread: list[str] = []  # messages sent in while the agent works, not read by it yet
        self._typed: dict[str, str] = {}  # what the person typed, by the message the agent reads
        self._screening = asyncio.Lock()  # messages typed while the agent works: screened in order
        self._asking: set[asyncio.Task[None]] = set()
        self._last_ending = ""  # the message of the agent's last Done
        self.thread.submit(self._start())

    # -- the UI's side (thread-safe) ---------------------------------------------------------------

    def run(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run one of the session's coroutines in the agent thread."""
        return self.thread.submit(work)

    def send(self, text: str) -> concurrent.futures.Future[None]:
        """A message from the person: a new request, or, while the agent works, one it reads next."""
        return self.run(self._send(text))

    def approve(self, plan: Plan, policy: str) -> concurrent.futures.Future[None]:
        """The person approved ``plan`` (perhaps edited) to be carried out under ``policy``: plan mode
        ends and the agent goes on with the plan in the conversation, as a request of its own."""
        return self.run(self._approve(plan, policy_named(policy)))

    def interrupt(self) -> None:
        self.thread.call(self._interrupt)

    def answer(self, call_id: str, choice: str, feedback: str = "") -> None:
        """The person's answer to an approval (a denial may say what to do instead: ``feedback``,
        which the model reads, so the UserPromptSubmit hooks see it first)."""
        if feedback:
            self.run(self._answer_screened(call_id, choice, feedback))
        else:
            self.thread.call(self._answer, call_id, choice, feedback)

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

    def _budget(self) -> Budget:
        return Budget(self.options.max_steps, self.options.max_time_s, self.options.max_tokens)

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
        self.status.limits = self._budget().limits()
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
        if self._policy_note:
            self._emit(
                Notice(text=self._policy_note, level="warning" if self.options.policy_chosen else "info")
            )
        await self._start_sandbox()

    async def restart_sandbox(self, kind: str | None = None) -> None:
        """After a failed start: start the sandbox again (``/sandbox retry``), or a sandbox of another
        kind (``/sandbox local``); a :class:`CloverError` when one is up or starting."""
        if self.backend is None:
            raise CloverError("the model backend did not start; fix that and start the TUI again")
        if self._ready is not None and not self._ready.done():
            raise CloverError("the sandbox is still starting")
        if self.agent is not None:
            raise CloverError(f"the {self.options.sandbox_kind} sandbox is up already")
        if self.parts is not None:  # what the failed start left
            with contextlib.suppress(*RUN_ERRORS, OSError):
                await self.parts.close()
            self.parts, self.sandbox, self.mcp = None, None, None
        if kind is not None:
            self.options.sandbox_kind = kind
        self._ready = asyncio.get_running_loop().create_future()
        self._start_task = asyncio.current_task()
        await self._start_sandbox()

    async def _start_sandbox(self) -> None:
        assert self._ready is not None and self.backend is not None
        saved = self.options.resume
        self._sandbox_state("starting")
        spec = self.options.spec
        self.parts = AgentSession(
            dataclasses.replace(self.options, policy=self.policy),
            self.bus,
            run_id=self.session_id,
            folder=self.folder,
            report=lambda message: self._emit(Notice(text=message, level="warning")),
        )
        try:
            self.sandbox = await self.parts.open_sandbox()
            self.handback = SessionHandBack(
                self.sandbox,
                self.options.sandbox_kind,
                spec,
                self.repo,
                self.folder / "handback",
                bus=self.bus,
                hooks=self.parts.hooks,
            )
            await self.handback.start()
            agent = await self.parts.open_agent(
                self.backend, self._budget(), Approvals(), conversation=True, planning=True
            )
            self.mcp = self.parts.mcp
            if saved is not None and saved.state is not None:
                await self._take_up(agent, saved)
            if self.planning:
                agent.start_planning()
            self.system = await self.parts.system_prompt(INTERACTIVE_NOTE)
        except RUN_ERRORS as exc:
            other = "local" if self.options.sandbox_kind != "local" else "docker"
            caveat = (
                " (no isolation: its commands run directly on this machine, as you)"
                if other == "local"
                else ""
            )
            self._sandbox_state(
                "failed",
                f"{message_of(exc)} — /sandbox retry tries again, /sandbox {other} uses the {other} sandbox"
                + caveat,
            )
            self._ready.set_result(False)
            return
        self.agent = agent
        self._sandbox_state("ready", self.sandbox.warning or "")
        self._ready.set_result(True)

    async def _take_up(self, agent: Agent, saved: SavedSession) -> None:
        """A resumed session: the agent takes up its conversation, its snapshots and its workspace."""
        assert saved.state is not None
        tracked = next((e for e in reversed(saved.events) if isinstance(e, PlanUpdated)), None)
        if tracked is not None and tracked.stage != "proposed":  # update_plan goes on tracking it
            agent.plan = Plan.from_dict(tracked.plan)
        try:
            lost = await agent.resume(saved.state, fresh_budget=True)
        except WorkspaceCheckpointError as exc:
            self._emit(
                Notice(
                    text=f"The saved session's changes could not be restored ({exc.message}); "
                    "the workspace is your working tree as it is now.",
                    level="warning",
                )
            )
            return
        if lost:
            steps = ", ".join(str(c.turn) for c in lost)
            self._emit(
                Notice(
                    text=f"The workspace as it was at step {steps} could not be rebuilt (the working tree "
                    "changed since the session was saved): /undo cannot go back that far.",
                    level="warning",
                )
            )

    def _sandbox_state(self, state: str, message: str = "") -> None:
        self.status.sandbox = state
        self._emit(SandboxState(state=state, kind=self.options.sandbox_kind, message=message))

    async def _wait_ready(self) -> Agent:
        assert self._ready is not None
        if not await asyncio.shield(self._ready) or self.agent is None:
            raise CloverError("the session cannot work: the sandbox or the model backend did not start")
        return self.agent

    async def _approve(self, plan: Plan, policy: Policy) -> None:
        agent = await self._wait_ready()
        while self._working:  # the run that proposed the plan is still ending
            await asyncio.sleep(0.05)
        message = agent.approve_plan(plan, policy)
        self.planning, self.policy = False, policy
        self.status.policy = self.info.policy = policy.name
        said = f"Plan approved; the agent carries it out under the {policy.name} policy."
        self._emit(Notice(text=said, data={"planning": False}))
        await self._send(f"Approved the plan: {' '.join(plan.summary.split())}", message)

    async def _send(self, text: str, message: str | None = None) -> None:
        """``message``: what the model reads, when it is not ``text`` (an approved plan)."""
        screened = False
        if self._working:
            sent = await self._screen_queued(text)
            if sent is None:
                return
            if self._working:
                self._steer(text, sent)
                return
            message, screened = sent, True  # the run ended while the hooks ran: the next request
        self._working = True
        try:
            pending: tuple[str, str | None, bool] | None = (text, message, screened)
            while pending is not None:
                try:
                    await self._turn(*pending)
                    pending = await self._left_unread()
                except Exception as exc:  # not one the agent expects: this request ends, the session goes on
                    self._unexpected(exc)
                    pending = None
        finally:
            self._working = False

    @property
    def busy(self) -> bool:
        """The agent runs a request and is not waiting for the person after an interrupt (read from
        the UI's thread: a snapshot, enough for a key press). False as soon as the run ends, before
        its ``Done`` is shown."""
        agent = self.agent
        return agent is not None and agent.running and not agent.steering.paused

    def _unexpected(self, error: Exception) -> None:
        """An error no layer expected ended a request: said in the transcript where it happened (after
        the request's own events), its traceback kept in the session folder."""
        log = self.folder / ERRORS_FILE
        where = ""
        try:
            with log.open("a", encoding="utf-8") as out:
                out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
                out.write("".join(traceback.format_exception(error)))
            where = f" (the traceback is in {log})"
        except OSError:
            pass
        text = f"{type(error).__name__}: {error}"[:300]
        if text in self._last_ending:  # the agent's Done said it already
            text = type(error).__name__
        self._emit(
            Notice(
                text=f"The request ended on an unexpected error, {text}{where}. "
                "The session goes on: send the next request.",
                level="error",
            )
        )

    async def _screen_queued(self, text: str) -> str | None:
        """A message typed while the agent works (or waits after Esc, or its sandbox starts; or a
        denial's words), as the model is to read it once the UserPromptSubmit hooks let it through;
        None when it is not sent (a hook blocked it, or the session cannot work): ``MessageNotSent``
        says why. One at a time, in the order sent, so the queue keeps the person's order."""
        async with self._screening:
            try:
                agent = await self._wait_ready()  # typed while the sandbox starts: once it is up
                return await agent.screened(sandbox_paths(self.repo, text))
            except PromptBlocked as exc:
                reason = exc.reason
            except CloverError as exc:
                reason = exc.message
            agent_now = self.agent
            waiting = agent_now is not None and agent_now.running and agent_now.steering.paused
            self._emit(MessageNotSent(text=text, reason=reason, waiting=waiting))
            return None

    def _steer(self, text: str, sent: str) -> None:
        """A screened message while the agent works: the agent reads it (``sent``) at its next step
        (at once when an interrupt made it wait)."""
        assert self.agent is not None
        self._unread.append(sent)
        self._typed[sent] = text
        self._emit(MessageQueued(text=text, sent=sent))
        self.agent.send(sent)

    async def _left_unread(self) -> tuple[str, str, bool] | None:
        """A message the agent did not read before its run ended is the next request (any later
        ones go in with it, read at its first step): what was typed, what the model reads (screened
        already) and True."""
        agent = self.agent
        if not self._unread or agent is None:
            return None
        self._unread.clear()
        agent.steering.resume()  # a new request comes of them: nothing more to wait for
        messages = await agent.steering.take_messages()
        if not messages:
            return None
        first, *rest = messages
        for text in rest:
            self._unread.append(text)
            agent.send(text)
        return self._typed.pop(first, first), first, True

    def _observe(self, event: Event) -> None:
        if isinstance(event, Done):
            self._last_ending = event.message
        elif isinstance(event, MessageAdded) and event.message.get("role") == "user":
            content = event.message.get("content")
            if content in self._unread:
                self._unread.remove(content)
                self._typed.pop(content, None)
        elif isinstance(event, ApprovalRequested):
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _turn(self, text: str, message: str | None = None, screened: bool = False) -> None:
        """One request: shown, recorded, and run by the agent to its end (``message``: see ``_send``;
        ``screened``: it went through the UserPromptSubmit hooks already, typed during the last run)."""
        agent = self.agent
        saved = self.options.resume.state if self.options.resume else None
        first_step = agent.next_step if agent else (saved.steps if saved else 0) + 1
        turn = Turn(len(self.turns) + 1, text, first_step)
        self.turns.append(turn)
        self._emit(TurnStarted(turn=turn.turn, text=text, first_step=turn.first_step))
        self.info.title = self.info.title or " ".join(text.split())[:80]
        self.info.requests = len(self.turns)
        self._save_info()
        if agent is None and self.status.sandbox == "starting":
            self._emit(Notice(text="Waiting for the sandbox to start…"))
        try:
            agent = await self._wait_ready()
        except CloverError as exc:
            self._emit(Notice(text=exc.message, level="error"))
            return
        agent.budget = self._budget()  # budgets count per request
        message = message or sandbox_paths(self.repo, text)
        work = (
            agent.continue_with(message, screened=screened)
            if agent.messages
            else agent.run(message, self.system)
        )
        self._request = asyncio.ensure_future(work)
        try:
            await self._request
        finally:
            self._request = None
            self._save_info()

    async def save_draft(self, text: str) -> None:
        """Keep the prompt's unsent text with the session (``session.json``), for a resume. A session
        with no request and no draft writes nothing (the picker does not list it)."""
        if not text and not self.turns and not self.info.draft:
            return
        self.info.draft = text
        self._save_info()

    def _save_info(self) -> None:
        self.info.updated = time.time()
        write_info(self.folder, self.info, self.options.record_key)

    def _interrupt(self) -> None:
        """Esc: the call under way stops (``CallInterrupted`` says so) and the agent waits for a
        message; between calls, it waits before its next model call."""
        agent = self.agent
        if agent is not None and agent.running and not agent.interrupt() and not self._unread:
            self._emit(Notice(text="The agent stops before its next model call and waits for your message."))

    async def _answer_screened(self, call_id: str, choice: str, feedback: str) -> None:
        """A denial saying what to do instead: its words once the hooks let them through; blocked,
        the call is denied without them (``MessageNotSent`` says why)."""
        sent = await self._screen_queued(feedback)
        self._answer(call_id, choice, sent or "")

    def _answer(self, call_id: str, choice: str, feedback: str = "") -> None:
        if self.agent is not None:
            self.agent.answer_approval(call_id, Answer(choice), feedback)

    async def _ask(self, event: ApprovalRequested) -> None:
        """Show the request to the person, with the diff an edit would make."""
        preview = ""
        if self.sandbox is not None:
            try:
                preview = await edit_preview(self.sandbox, event.name, event.arguments)
            except (*RUN_ERRORS, OSError):
                preview = ""
        self._emit(
            ApprovalNeeded(
                call_id=event.call_id,
                name=event.name,
                arguments=event.arguments,
                reason=event.reason,
                always=event.always,
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
        if self._request is not None and not self._request.done():  # the run ends as interrupted
            self._request.cancel()
            with contextlib.suppress(asyncio.CancelledError, *RUN_ERRORS):
                await self._request
        up = self.parts is not None and self.parts.sandbox is not None
        try:
            if self.parts is not None:
                await self.parts.close(self.backend)
            elif self.backend is not None:
                await self.backend.close()
        finally:
            if up:
                self._sandbox_state("closed")
            await self.bus.drain()
            self._writer.close()


def _resumed_planning(events: list[Event]) -> bool:
    """A session saved in plan mode resumes in plan mode (its policy, ``SessionInfo.policy``, is the
    one plan mode goes back to)."""
    said = [e.data["planning"] for e in events if isinstance(e, Notice) and "planning" in e.data]
    return bool(said and said[-1])


def _resumed_policy(options: SessionConfig) -> tuple[Policy, str]:
    """The policy a session starts with, and what to say about it: a resumed session keeps the one
    it had (the status bar shows it) unless ``--policy`` chose another for this start, which is said."""
    saved = options.resume
    if saved is None:
        return options.policy, ""
    had = saved.info.policy or next(
        (e.policy for e in reversed(saved.events) if isinstance(e, SessionStarted)), ""
    )
    if not had or had == options.policy.name:
        return options.policy, ""
    if options.policy_chosen:
        return options.policy, f"Policy: {options.policy.name}, as --policy chose; this session had {had}."
    try:
        return policy_named(had), ""  # kept, as the status bar shows
    except UsageError:  # a policy this version no longer has
        return (
            options.policy,
            f"Policy: {options.policy.name}; this session had {had}, which is unknown here.",
        )
