"""One ACP session: a sandbox, a backend and an :class:`~clover_agent.agent.loop.Agent`, driven
through the seams the TUI uses (docs/architecture.md, "Steering the agent").

A prompt is ``run`` (the first) or ``continue_with``; ``session/cancel`` is ``interrupt``: the call
under way stops, the prompt ends ``cancelled`` and the agent waits, so the next prompt is the
message it goes on with (``send``). A call the policy asks about becomes ``session/request_permission``.
Every event goes to the session's trajectory first (the TUI's session store: ``session/load`` and
``clover-agent tui --resume`` read the same folder), then out as ``session/update``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from acp import (
    schema,
    start_tool_call,
    tool_diff_content,
    update_agent_message_text,
    update_tool_call,
    update_user_message_text,
)

from clover_agent.acp.updates import UpdateMaker, action_of, kind_of
from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import Agent, RunResult
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, message_of
from clover_agent.events import (
    ApprovalRequested,
    ErrorReported,
    Event,
    EventBus,
    HookRan,
    ModelResponded,
    ToolCallFinished,
    ToolCallStarted,
)
from clover_agent.handback.session import SessionHandBack
from clover_agent.hooks import hook_line
from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.session.assembly import AgentSession, SessionConfig
from clover_agent.session.events import SessionStarted, TurnStarted
from clover_agent.session.store import SessionInfo, new_session_id, session_dir, write_info
from clover_agent.tools.mcp import McpServers

log = logging.getLogger("clover_agent.acp")

#: The permission options of an approval, by ACP option id: the answer each maps to.
APPROVAL_OPTIONS: tuple[tuple[schema.PermissionOptionKind, str, Answer], ...] = (
    ("allow_once", "Allow once", Answer.ONCE),
    ("allow_always", "Allow always", Answer.ALWAYS),
    ("reject_once", "Reject", Answer.DENY),
    ("reject_always", "Reject always", Answer.DENY),
)
APPLY, KEEP = "apply", "keep"
#: Said to the model in every ACP session, after the repository's system prompt.
EDITOR_NOTE = """

# Working with the user
You are working with a person in their editor. Each of their messages is a request; work on it with
your tools. When you changed files and the work is done, call `finish` with a summary for them; to
answer a question, or when you need their answer to go on, reply in plain text with no tool call
(that ends your turn). Your changes reach their files only when they accept them at the end. They
may cancel you and correct course: follow their latest message."""
#: What a run's outcome is as an ACP stop reason (an error is told as text and ends the turn).
STOP_REASONS: dict[str, schema.StopReason] = {
    "budget_exhausted": "max_turn_requests",
    "interrupted": "cancelled",
}


class Client:
    """What a session needs of the ACP client connection (the SDK's ``AgentSideConnection``)."""

    def __init__(self, conn: Any, can_write: bool) -> None:
        self.conn = conn
        self.can_write = can_write


class AcpSession:
    """The session (see the module docstring). :meth:`start` before anything else."""

    def __init__(self, config: SessionConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self.repo = config.repo
        saved = config.resume
        self.session_id = saved.info.session_id if saved else new_session_id()
        self.folder = session_dir(self.repo, self.session_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.info = (
            saved.info if saved else SessionInfo(self.session_id, str(self.repo), created=now, updated=now)
        )
        self.turns = sum(isinstance(e, TurnStarted) for e in saved.events) if saved else 0
        self.bus = EventBus()
        self._writer = TrajectoryWriter(self.folder / TRAJECTORY_FILE, key=config.record_key)
        self.bus.subscribe(self._writer)
        self.bus.subscribe(self._forward)
        self.updates = UpdateMaker(self.repo)
        self.backend: ModelBackend | None = None
        self.sandbox: Sandbox | None = None
        self.mcp: McpServers | None = None
        self.parts: AgentSession | None = None  # the sandbox, the MCP servers and the agent, opened
        self._notes: list[str] = []
        self.agent: Agent | None = None
        self.handback: SessionHandBack | None = None
        self.system = ""
        self._run: asyncio.Future[RunResult] | None = None  # the agent's run (paused after a cancel)
        self._cancelled: asyncio.Event | None = None  # set by cancel() while a prompt is answered
        self._rejected: set[tuple[str, str]] = set()  # (action, command) answered "reject always"
        self._asking: set[asyncio.Task[None]] = set()

    @property
    def answering(self) -> bool:
        """Whether a prompt of this session is being answered now."""
        return self._cancelled is not None

    async def _send(self, update: Any) -> None:
        try:
            await self.client.conn.session_update(session_id=self.session_id, update=update)
        except (ConnectionError, OSError) as exc:  # the client went away: the session goes on to its end
            log.warning("session/update not sent: %s", exc)

    async def _forward(self, event: Event) -> None:
        for update in self.updates.updates(event):
            await self._send(update)
        line = hook_line(event) if isinstance(event, HookRan) else None
        if line is not None:  # said at once during a prompt; before one, with the next prompt's answer
            if self.answering:
                await self._send(update_agent_message_text(f"\n[hook: {line}]\n"))
            else:
                self._notes.append(f"hook: {line}")
        if isinstance(event, ApprovalRequested):
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    # -- start and load ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the backend and the sandbox (raising what is missing), and take up a saved session."""
        self.backend = self.config.make_backend()
        self.updates.context_window = self.backend.context_window
        self.info.backend = self.backend.name
        saved = self.config.resume
        self.bus.emit(
            SessionStarted(
                session_id=self.session_id,
                repo=str(self.repo),
                backend=self.backend.name,
                sandbox=self.config.sandbox_kind,
                policy=self.config.policy.name,
                context_window=self.backend.context_window,
                resumed=saved is not None,
            )
        )
        self.parts = AgentSession(
            self.config,
            self.bus,
            run_id=self.session_id,
            folder=self.folder,
            report=self._note,
        )
        self.sandbox = await self.parts.open_sandbox()
        agent = await self.parts.open_agent(self.backend, self._budget(), Approvals(), conversation=True)
        self.mcp = self.parts.mcp
        # stock is taken of the user's tree as it is (before a saved session's changes come back):
        # what the session offers is everything it changed that the tree does not hold yet
        self.handback = SessionHandBack(
            self.sandbox,
            self.config.sandbox_kind,
            self.config.spec,
            self.repo,
            self.folder / "handback",
            bus=self.bus,
            hooks=self.parts.hooks,
        )
        await self.handback.start()
        if saved is not None and saved.state is not None:
            await agent.resume(saved.state, fresh_budget=True)
        self.system = await self.parts.system_prompt(EDITOR_NOTE)
        self.agent = agent
        await self.bus.drain()
        self._save_info()

    async def replay_history(self) -> None:
        """The saved conversation as updates (``session/load``): requests, replies, tool calls."""
        saved = self.config.resume
        if saved is None:
            return
        history = UpdateMaker(self.repo)
        for event in saved.events:
            if isinstance(event, TurnStarted):
                await self._send(update_user_message_text(event.text))
            elif isinstance(event, ModelResponded | ToolCallStarted | ToolCallFinished):
                for update in history.updates(event):
                    await self._send(update)

    def _note(self, message: str) -> None:
        """A problem to tell the user (an MCP server that did not start): recorded now, shown with
        the next prompt's answer (the client knows no session before session/new answers)."""
        self.bus.emit(ErrorReported(kind="mcp", message=message))
        self._notes.append(message)

    def _budget(self) -> Budget:
        return Budget(self.config.max_steps, self.config.max_time_s, self.config.max_tokens)

    def _save_info(self) -> None:
        self.info.updated = time.time()
        write_info(self.folder, self.info, self.config.record_key)

    # -- prompts -------------------------------------------------------------------------------------

    async def prompt(self, text: str, title: str = "") -> schema.StopReason:
        """Answer one prompt (``title``: what the session list shows of it; default ``text``)."""
        agent = self.agent
        assert agent is not None, "start() first"
        self.turns += 1
        self.bus.emit(TurnStarted(turn=self.turns, text=text, first_step=agent.next_step))
        self.info.title = self.info.title or " ".join((title or text).split())[:80]
        self.info.requests = self.turns
        self._save_info()
        for note in self._notes:
            await self._send(update_agent_message_text(f"Note: {note}\n\n"))
        self._notes.clear()
        message = text.replace(str(self.repo) + "/", WORKSPACE + "/")
        cancelled = self._cancelled = asyncio.Event()
        if self._run is not None and not self._run.done():  # paused after a cancel: this goes on
            agent.send(message)
        else:
            agent.budget = self._budget()  # budgets count per request
            work = agent.continue_with(message) if agent.messages else agent.run(message, self.system)
            self._run = asyncio.ensure_future(work)
        run = self._run
        waiting = asyncio.ensure_future(cancelled.wait())
        try:
            either: set[asyncio.Future[Any]] = {run, waiting}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if cancelled.is_set():
                await self._stopped(agent, run)
        finally:
            waiting.cancel()
            self._cancelled = None
        if not run.done():  # cancelled: the agent waits for the next prompt, which goes on with it
            await self.bus.drain()
            self._save_info()
            return "cancelled"
        self._run = None
        result = run.result()
        await self.bus.drain()
        if not result.ended_well and result.outcome != "interrupted":
            await self._send(update_agent_message_text(f"\n\nThe agent stopped: {result.message}"))
        if result.ended_well and not cancelled.is_set():
            await self._offer_handback()
        self._save_info()
        return "cancelled" if cancelled.is_set() else STOP_REASONS.get(result.outcome, "end_turn")

    async def _stopped(self, agent: Agent, run: asyncio.Future[RunResult]) -> None:
        """Until the run has stopped after a cancel: waiting for a message, or ended. A call that
        started after the interrupt (the interrupt came between two calls) is interrupted too."""
        while not run.done() and not agent.waiting_for_user:
            if agent.steering.busy:
                agent.interrupt()
            await asyncio.sleep(0.02)

    def cancel(self) -> None:
        """``session/cancel``: stop the call under way; the prompt being answered ends ``cancelled``."""
        if self._cancelled is None or self.agent is None:
            return
        self.agent.interrupt()
        self._cancelled.set()

    # -- approvals -----------------------------------------------------------------------------------

    async def _ask(self, event: ApprovalRequested) -> None:
        agent = self.agent
        if agent is None:
            return
        key = (action_of(event.name, event.arguments), str(event.arguments.get("command", "")))
        if key in self._rejected:
            agent.answer_approval(event.call_id, Answer.DENY)
            return
        call = schema.ToolCallUpdate(
            tool_call_id=event.call_id,
            title=self.updates.title(event.name, event.arguments),
            kind=kind_of(event.name, event.arguments),
            status="pending",
            raw_input=event.arguments,
            content=[
                schema.ContentToolCallContent(
                    type="content", content=schema.TextContentBlock(type="text", text=text)
                )
                for text in _permission_texts(event)
            ],
        )
        options = [
            schema.PermissionOption(option_id=kind, name=name, kind=kind)
            for kind, name, _ in APPROVAL_OPTIONS
        ]
        try:
            response = await self.client.conn.request_permission(
                session_id=self.session_id, tool_call=call, options=options
            )
            chosen = getattr(response.outcome, "option_id", None)
        except Exception as exc:  # the client failed to answer: deny, as with no one to ask
            log.warning("session/request_permission failed: %s", exc)
            chosen = None
        answers: dict[str, Answer] = {kind: answer for kind, _, answer in APPROVAL_OPTIONS}
        answer = answers.get(chosen or "", Answer.DENY)
        if chosen == "reject_always":
            self._rejected.add(key)
        agent.answer_approval(event.call_id, answer)

    # -- the hand-back -------------------------------------------------------------------------------

    async def _offer_handback(self) -> None:
        handback = self.handback
        if handback is None:
            return
        try:
            offer = await handback.offer()
        except RUN_ERRORS as exc:
            await self._send(
                update_agent_message_text(f"\n\nThe changes could not be checked: {message_of(exc)}")
            )
            return
        if offer is None:
            return
        call_id = f"handback-{self.turns}"
        files = len(offer.patch.changes)
        title = f"Hand back {files} file{'s' if files != 1 else ''} ({offer.judged.verdict})"
        findings = "".join(f"\n- {item}" for item in offer.review)
        content: list[schema.ContentToolCallContent | schema.FileEditToolCallContent] = [
            _text(f"Verdict: {offer.verdict}" + (f"\nLook before applying:{findings}" if findings else ""))
        ]
        content += [
            tool_diff_content(str(self.repo / c.path), offer.texts[c.path][1] or "", offer.texts[c.path][0])
            for c in offer.patch.changes
        ]
        left_out = "".join(f"\n- {path}: {why}" for path, why in offer.patch.left_out.items())
        await self._send(start_tool_call(call_id, title, kind="edit", status="pending", content=content))
        call = schema.ToolCallUpdate(tool_call_id=call_id, title=title, kind="edit", status="pending")
        options = [
            schema.PermissionOption(option_id=APPLY, name="Apply to my files", kind="allow_once"),
            schema.PermissionOption(option_id=KEEP, name="Keep in the sandbox", kind="reject_once"),
        ]
        try:
            response = await self.client.conn.request_permission(
                session_id=self.session_id, tool_call=call, options=options
            )
            chosen = getattr(response.outcome, "option_id", None)
        except Exception as exc:
            log.warning("session/request_permission failed: %s", exc)
            chosen = None
        if chosen != APPLY:
            note = "Kept in the sandbox: not applied." + (f"\nLeft out:{left_out}" if left_out else "")
            await self._send(update_tool_call(call_id, status="completed", content=[*content, _text(note)]))
            return
        write = self._write_text if self.client.can_write else None
        try:
            applied, how = await handback.apply(offer, write)
        except (*RUN_ERRORS, OSError) as exc:
            await self._send(
                update_tool_call(call_id, status="failed", content=[*content, _text(message_of(exc))])
            )
            return
        where = "through the editor" if how == "editor" else "on disk"
        note = f"Applied {where}: {', '.join(applied.files)}." + "".join(f"\n{n}" for n in applied.notes())
        note += f"\nLeft out:{left_out}" if left_out else ""
        await self._send(update_tool_call(call_id, status="completed", content=[*content, _text(note)]))

    async def _write_text(self, path: str, text: str) -> None:
        await self.client.conn.write_text_file(session_id=self.session_id, path=path, content=text)

    # -- the end -------------------------------------------------------------------------------------

    async def close(self) -> None:
        for task in list(self._asking):
            task.cancel()
        if self._run is not None and not self._run.done():
            self._run.cancel()
            with contextlib.suppress(asyncio.CancelledError, *RUN_ERRORS):
                await self._run
        try:
            if self.parts is not None:
                await self.parts.close(self.backend)
            elif self.backend is not None:
                await self.backend.close()
        finally:
            with contextlib.suppress(Exception):
                await self.bus.drain()
            self._writer.close()


def _text(text: str) -> schema.ContentToolCallContent:
    return schema.ContentToolCallContent(
        type="content", content=schema.TextContentBlock(type="text", text=text)
    )


def _permission_texts(event: ApprovalRequested) -> list[str]:
    """What an approval request says beside the call: why the policy asks, what each "always"
    answer covers (ACP has no words with an answer: to say what to do instead, reject and write)."""
    texts = [event.reason]
    if event.always:
        texts.append(f"Allow always: allows {event.always}.")
    command = str(event.arguments.get("command", ""))
    refused = f"`{command}`" if command else f"every `{action_of(event.name, event.arguments)}` call"
    texts.append(
        f"Reject always: refuses {refused} without asking, for the rest of the session. "
        "To say what to do instead, reject and send a message."
    )
    return texts
