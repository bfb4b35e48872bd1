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
import posixpath
import time
from typing import Any

from acp import (
    schema,
    start_tool_call,
    tool_diff_content,
    tool_terminal_ref,
    update_agent_message_text,
    update_tool_call,
    update_user_message_text,
)
from acp.helpers import update_available_commands, update_current_mode

from clover_agent.acp import commands
from clover_agent.acp.modes import PLAN, Mode, modes_for
from clover_agent.acp.preview import preview_edit
from clover_agent.acp.terminals import Terminals
from clover_agent.acp.updates import UpdateMaker, action_of, kind_of
from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import Agent, RunResult
from clover_agent.agent.plan import Plan
from clover_agent.agent.policy import with_mcp
from clover_agent.agent.trajectory import TRAJECTORY_FILE, TrajectoryWriter
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, message_of
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallInterrupted,
    ErrorReported,
    Event,
    EventBus,
    HookRan,
    ModelResponded,
    PlanUpdated,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
)
from clover_agent.handback.session import Offer, SessionHandBack
from clover_agent.handback.shadow import REGULAR
from clover_agent.hooks import hook_line
from clover_agent.safe_text import terminal_safe
from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.session.assembly import AgentSession, SessionConfig
from clover_agent.session.events import SessionStarted, TurnStarted, TurnsUndone
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
#: The answers to a proposed plan: the mode the plan is carried out in (another option: keep planning).
PLAN_OPTIONS: tuple[tuple[str, str, schema.PermissionOptionKind], ...] = (
    ("auto", "Approve: carry it out, editing without asking", "allow_always"),
    ("ask", "Approve: carry it out, asking before each edit", "allow_once"),
    ("keep", "Keep planning", "reject_once"),
)
#: Said to the model in every ACP session, after the repository's system prompt.
EDITOR_NOTE = """

# Working with the user
You are working with a person in their editor. Each of their messages is a request; work on it with
your tools. When you changed files and the work is done, call `finish` with a summary for them; to
answer a question, or when you need their answer to go on, reply in plain text with no tool call
(that ends your turn). Your changes reach their files only when they accept them at the end. They
may cancel you and correct course: follow their latest message."""
#: What the model reads when the person stopped a command's terminal in their editor.
STOPPED_IN_TERMINAL = "[I stopped that command in my editor's terminal. Do not run it again as it was.]"
#: What a run's outcome is as an ACP stop reason (an error is told as text and ends the turn).
STOP_REASONS: dict[str, schema.StopReason] = {
    "budget_exhausted": "max_turn_requests",
    "interrupted": "cancelled",
}


class Client:
    """What a session needs of the ACP client connection (the SDK's ``AgentSideConnection``)."""

    def __init__(self, conn: Any, can_write: bool, can_terminal: bool = False) -> None:
        self.conn = conn
        self.can_write = can_write
        self.can_terminal = can_terminal  # shell calls' output shown in its terminals


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
        #: The requests as (turn, first step), for ``/undo`` (undone ones left out).
        self.requests = _requests(saved.events) if saved else []
        self.modes, self.mode = modes_for(config.policy)
        #: Model calls, tokens in, tokens out: of the last request, and of the session (``/usage``).
        self.usage_last, self.usage_total = (0, 0, 0), (0, 0, 0)
        #: Files (repository paths) as an edit the person approved left them, since the last
        #: hand-back: the hand-back of exactly these is not asked about again (one question per edit).
        #: path -> (its text before the first approved edit, its text after the last): a chain of
        #: approved edits, each from the text the one before left (else it starts again).
        self._approved: dict[str, tuple[str | None, str]] = {}
        self._asked: set[str] = set()  # call ids the person allowed
        self._calls: dict[str, tuple[str, dict[str, Any]]] = {}  # call id -> (tool, arguments), running
        self.bus = EventBus()
        self._writer = TrajectoryWriter(self.folder / TRAJECTORY_FILE, key=config.record_key)
        self.bus.subscribe(self._writer)
        self.bus.subscribe(self._forward)
        self.updates = UpdateMaker(self.repo)
        self.terminals = Terminals(client.conn, self.session_id, self.repo, self._terminal_stopped)
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
        self._commanding = False  # a slash command is being answered

    @property
    def answering(self) -> bool:
        """Whether a prompt of this session is being answered now."""
        return self._cancelled is not None or self._commanding

    def ready(self) -> tuple[Agent, SessionHandBack]:
        """The agent and the hand-back of a started session."""
        if self.agent is None or self.handback is None:
            raise CloverError("the session has not started")
        return self.agent, self.handback

    async def _send(self, update: Any) -> None:
        try:
            await self.client.conn.session_update(session_id=self.session_id, update=update)
        except (ConnectionError, OSError) as exc:  # the client went away: the session goes on to its end
            log.warning("session/update not sent: %s", exc)

    async def _forward(self, event: Event) -> None:
        self._follow(event)
        if isinstance(event, ToolOutput) and event.name == "shell" and self.client.can_terminal:
            terminal = await self.terminals.output(event.call_id, event.text)
            if terminal is not None and event.call_id not in self.updates.terminals:
                self.updates.terminals[event.call_id] = terminal  # shown there from now on
                await self._send(update_tool_call(event.call_id, content=[tool_terminal_ref(terminal)]))
        for update in self.updates.updates(event):
            await self._send(update)
        if isinstance(event, CallInterrupted) and event.call_id:
            await self.terminals.end(event.call_id, None, killed=True)
        elif isinstance(event, ToolCallFinished):
            code = (event.data or {}).get("exit_code")
            await self.terminals.end(event.call_id, code if isinstance(code, int) else None)
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

    def _terminal_stopped(self, call_id: str) -> None:
        """The person stopped a command's terminal in the editor: the command is stopped in the
        sandbox (the agent's interrupt, with everything it started) and the agent goes on, told."""
        if self.agent is not None and call_id in self._calls:
            self.agent.interrupt(STOPPED_IN_TERMINAL)

    def _follow(self, event: Event) -> None:
        """Keep what the commands and the hand-back need of the events: the tokens used, and the
        files as the edits the person approved left them."""
        if isinstance(event, ModelResponded):
            calls, read, written = self.usage_last
            self.usage_last = (calls + 1, read + event.prompt_tokens, written + event.completion_tokens)
            calls, read, written = self.usage_total
            self.usage_total = (calls + 1, read + event.prompt_tokens, written + event.completion_tokens)
        elif isinstance(event, ToolCallStarted):
            self._calls[event.call_id] = (event.name, event.arguments)
        elif isinstance(event, ApprovalDecided) and event.approved and event.decided_by == "user":
            self._asked.add(event.call_id)
        elif isinstance(event, ToolCallFinished):
            name, _ = self._calls.pop(event.call_id, ("", {}))
            data = event.data or {}
            path, old, new = data.get("path"), data.get("old_content"), data.get("new_content")
            if event.call_id in self._asked and name == "editor" and not event.is_error:
                where = _repo_path(path) if isinstance(path, str) else None
                if where is not None and isinstance(new, str) and (old is None or isinstance(old, str)):
                    first, last = self._approved.get(where, (old, old))
                    self._approved[where] = (first if last == old else old, new)
            self._asked.discard(event.call_id)

    # -- modes ---------------------------------------------------------------------------------------

    def mode_state(self) -> schema.SessionModeState:
        return schema.SessionModeState(
            current_mode_id=self.mode.id, available_modes=[mode.schema() for mode in self.modes]
        )

    async def set_mode(self, mode_id: str) -> Mode:
        """Switch to the mode ``mode_id`` (KeyError: no such mode): the agent's next call is checked
        against its policy, a call under way finishes under the old one."""
        mode = next((m for m in self.modes if m.id == mode_id), None)
        if mode is None:
            raise KeyError(mode_id)
        self.mode = mode
        if self.agent is not None:
            self._apply_mode(self.agent, mode)
        self.info.policy = mode.policy.name
        self._save_info()
        await self._send(update_current_mode(mode.id))
        return mode

    def _apply_mode(self, agent: Agent, mode: Mode) -> None:
        """Put ``agent`` under ``mode``: planning for ``plan`` (read-only until a plan is approved),
        else its policy (leaving plan mode without a plan)."""
        if mode.id == PLAN:
            agent.start_planning()
        else:
            agent.leave_planning()
            agent.policy = with_mcp(mode.policy, self.config.mcp_servers)

    async def announce(self) -> None:
        """What the editor shows beside the session: its slash commands and its mode (sent after
        ``session/new`` or ``session/load`` answered, when the editor knows the session)."""
        await self._send(update_available_commands([c.schema() for c in commands.COMMANDS]))
        await self._send(update_current_mode(self.mode.id))

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
        agent = await self.parts.open_agent(
            self.backend, self._budget(), Approvals(), conversation=True, planning=True
        )
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
        self._apply_mode(agent, self.mode)
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
                history.updates(event)
                await self._send(update_user_message_text(event.text))
            elif isinstance(event, ModelResponded | ToolCallStarted | ToolCallFinished | PlanUpdated):
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
        found = commands.parse(text)
        if found is not None:
            return await self._command(*found)
        self.turns += 1
        self.requests.append((self.turns, agent.next_step))
        self.usage_last = (0, 0, 0)
        self.bus.emit(TurnStarted(turn=self.turns, text=text, first_step=agent.next_step))
        self.info.title = self.info.title or " ".join((title or text).split())[:80]
        self.info.requests = self.turns
        self._save_info()
        for note in self._notes:
            await self._send(update_agent_message_text(f"Note: {note}\n\n"))
        self._notes.clear()
        message = text.replace(str(self.repo) + "/", WORKSPACE + "/")
        paused = self._run is not None and not self._run.done()
        if paused:  # after a cancel: the run goes on with it, once the UserPromptSubmit hooks let it
            try:
                message = await agent.screened(message)
            except CloverError as exc:  # blocked: the run still waits for a prompt
                await self._send(update_agent_message_text(f"The agent stopped: {exc.message}"))
                self._save_info()
                return "end_turn"
        cancelled = self._cancelled = asyncio.Event()
        if paused:
            agent.send(message)
        else:
            agent.budget = self._budget()  # budgets count per request
            work = agent.continue_with(message) if agent.messages else agent.run(message, self.system)
            self._run = asyncio.ensure_future(work)
        try:
            while True:
                assert self._run is not None  # the paused run, or the one just started
                result = await self._until_done(agent, self._run, cancelled)
                if result is None or result.plan is None or cancelled.is_set():
                    break
                go_on = await self._ask_plan(agent, result.plan, cancelled)
                if go_on is None:  # kept planning: the next prompt says what to change
                    break
                self._run = asyncio.ensure_future(agent.continue_with(go_on))
        finally:
            self._cancelled = None
        if result is None:  # cancelled: the agent waits for the next prompt, which goes on with it
            await self.bus.drain()
            self._save_info()
            return "cancelled"
        self._run = None
        await self.bus.drain()
        if not result.ended_well and result.outcome != "interrupted":
            await self._send(update_agent_message_text(f"\n\nThe agent stopped: {result.message}"))
        if result.ended_well and not cancelled.is_set():
            await self.offer_handback()
        self._save_info()
        return "cancelled" if cancelled.is_set() else STOP_REASONS.get(result.outcome, "end_turn")

    async def _until_done(
        self, agent: Agent, run: asyncio.Future[RunResult], cancelled: asyncio.Event
    ) -> RunResult | None:
        """The run's result once it ends; None when a cancel left it paused, waiting for a message."""
        waiting = asyncio.ensure_future(cancelled.wait())
        try:
            either: set[asyncio.Future[Any]] = {run, waiting}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if cancelled.is_set():
                await self._stopped(agent, run)
        finally:
            waiting.cancel()
        return run.result() if run.done() else None

    async def _ask_plan(self, agent: Agent, plan: Plan, cancelled: asyncio.Event) -> str | None:
        """The plan proposed in plan mode, put to the person as a permission request: approved, the
        session switches to the mode they chose and the message to go on with is returned (the plan
        carried into the conversation); otherwise None (still planning): an answer that comes after
        the prompt was cancelled approves nothing."""
        call_id = f"plan-{self.turns}-{agent.next_step}"
        title = f"Approve the plan ({len(plan.steps)} step{'s' if len(plan.steps) != 1 else ''})"
        content = [_text(plan.markdown())]
        await self._send(start_tool_call(call_id, title, kind="think", status="pending", content=content))
        call = schema.ToolCallUpdate(tool_call_id=call_id, title=title, kind="think", status="pending")
        options = [
            schema.PermissionOption(option_id=f"{PLAN}:{mode}", name=name, kind=kind)
            for mode, name, kind in PLAN_OPTIONS
        ]
        try:
            response = await self.client.conn.request_permission(
                session_id=self.session_id, tool_call=call, options=options
            )
            chosen = str(getattr(response.outcome, "option_id", "") or "")
        except Exception as exc:  # no answer: keep planning, as with a rejection
            log.warning("session/request_permission failed: %s", exc)
            chosen = ""
        offered = {f"{PLAN}:{mode}" for mode, _, kind in PLAN_OPTIONS if kind != "reject_once"}
        mode = next((m for m in self.modes if f"{PLAN}:{m.id}" == chosen in offered), None)
        mode = None if cancelled.is_set() else mode
        if mode is None:
            note = "Still planning: say what to change in the plan, or switch mode to leave plan mode."
            await self._send(update_tool_call(call_id, status="completed", content=[*content, _text(note)]))
            return None
        await self._send(
            update_tool_call(
                call_id, status="completed", content=[*content, _text(f"Approved: {mode.name}.")]
            )
        )
        policy = with_mcp(mode.policy, self.config.mcp_servers)
        go_on = agent.approve_plan(plan, policy)
        await self.set_mode(mode.id)
        return go_on

    async def _command(self, command: commands.Command, argument: str) -> schema.StopReason:
        """Run a slash command; its answer is a message (a failure too: it says why)."""
        self._commanding = True
        try:
            said = await command.run(self, argument)
        except RUN_ERRORS as exc:
            said = f"/{command.name}: {message_of(exc)}"
        finally:
            self._commanding = False
        await self.bus.drain()
        if said:
            await self._send(update_agent_message_text(said))
        self._save_info()
        return "end_turn"

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
        key = (action_of(event.name, event.arguments), _command_line(event))
        if key in self._rejected:
            agent.answer_approval(event.call_id, Answer.DENY)
            return
        content: list[
            schema.ContentToolCallContent | schema.FileEditToolCallContent | schema.TerminalToolCallContent
        ] = [_text(text) for text in _permission_texts(event)]
        change = (
            await preview_edit(self.sandbox, event.arguments)
            if event.name == "editor" and self.sandbox
            else None
        )
        if change is not None:  # the change it would make, before the person answers
            content.insert(0, tool_diff_content(self.updates.host_path(change.path), change.new, change.old))
        call = schema.ToolCallUpdate(
            tool_call_id=event.call_id,
            title=self.updates.title(event.name, event.arguments),
            kind=kind_of(event.name, event.arguments),
            status="pending",
            raw_input=event.arguments,
            content=content,
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

    async def offer_handback(self, *, always_ask: bool = False) -> bool:
        """Offer the session's changes for the user's tree (False: nothing to offer). Changes that
        are exactly what edits the person approved one by one, with nothing for them to review,
        are applied without a second question (unless ``always_ask``: ``/apply``)."""
        handback = self.handback
        if handback is None:
            return False
        try:
            offer = await handback.offer()
        except RUN_ERRORS as exc:
            await self._send(
                update_agent_message_text(f"\n\nThe changes could not be checked: {message_of(exc)}")
            )
            return True
        if offer is None:
            return False
        # beyond text edits (a symlink, a mode, a binary file) or by its path (CI, git's files): a yes
        confirm = offer.patch.to_confirm
        approved = not always_ask and not offer.review and not confirm and self._all_approved(offer)
        self._approved.clear()  # asked (or applied) once: a later hand-back of them is asked again
        call_id = f"handback-{self.turns}"
        files = len(offer.patch.changes)
        title = f"Hand back {files} file{'s' if files != 1 else ''} ({offer.judged.verdict})"
        findings = "".join(f"\n- {item}" for item in offer.review)
        for path, notes in confirm:  # a symlink's target is the model's: made inert
            said = path + ": " + ", ".join(notes)
            findings += "\n- " + terminal_safe(said, single_line=True, workflow_commands=False)
        content: list[schema.ContentToolCallContent | schema.FileEditToolCallContent] = [
            _text(f"Verdict: {offer.verdict}" + (f"\nLook before applying:{findings}" if findings else ""))
        ]
        content += [
            tool_diff_content(str(self.repo / c.path), offer.texts[c.path][1] or "", offer.texts[c.path][0])
            for c in offer.patch.changes
        ]
        left_out = "".join(f"\n- {path}: {why}" for path, why in offer.patch.left_out.items())
        await self._send(start_tool_call(call_id, title, kind="edit", status="pending", content=content))
        chosen = APPLY if approved else await self._ask_handback(call_id, title)
        if chosen != APPLY:
            note = "Kept in the sandbox: not applied." + (f"\nLeft out:{left_out}" if left_out else "")
            await self._send(update_tool_call(call_id, status="completed", content=[*content, _text(note)]))
            return True
        write = self._write_text if self.client.can_write else None
        try:
            applied, how = await handback.apply(offer, write)
        except (*RUN_ERRORS, OSError) as exc:
            await self._send(
                update_tool_call(call_id, status="failed", content=[*content, _text(message_of(exc))])
            )
            return True
        where = "through the editor" if how == "editor" else "on disk"
        note = f"Applied {where}: {', '.join(applied.files)}." + "".join(f"\n{n}" for n in applied.notes())
        note += " (You approved each change as it was made.)" if approved else ""
        note += f"\nLeft out:{left_out}" if left_out else ""
        await self._send(update_tool_call(call_id, status="completed", content=[*content, _text(note)]))
        return True

    def _all_approved(self, offer: Offer) -> bool:
        """Whether every file of ``offer`` is a plain file whose text is what approved edits made of
        it, one after another from its text at the start (a deletion, a mode, a symlink, or a
        command's change before an edit is no approved edit's: asked about)."""
        changes = offer.patch.changes
        return bool(changes) and all(
            c.path in self._approved
            and c.new_mode == REGULAR
            and c.old_mode in (0, REGULAR)
            and self._approved[c.path] == offer.texts[c.path]
            for c in changes
        )

    async def _ask_handback(self, call_id: str, title: str) -> str | None:
        """The person's answer to the hand-back: APPLY, KEEP, or None (no answer)."""
        call = schema.ToolCallUpdate(tool_call_id=call_id, title=title, kind="edit", status="pending")
        options = [
            schema.PermissionOption(option_id=APPLY, name="Apply to my files", kind="allow_once"),
            schema.PermissionOption(option_id=KEEP, name="Keep in the sandbox", kind="reject_once"),
        ]
        try:
            response = await self.client.conn.request_permission(
                session_id=self.session_id, tool_call=call, options=options
            )
        except Exception as exc:
            log.warning("session/request_permission failed: %s", exc)
            return None
        chosen = getattr(response.outcome, "option_id", None)
        return chosen if isinstance(chosen, str) else None

    async def _write_text(self, path: str, text: str) -> None:
        try:
            await self.client.conn.write_text_file(session_id=self.session_id, path=path, content=text)
        except Exception as exc:  # the editor refused or failed: the hand-back fails, said, not the prompt
            raise OSError(f"the editor could not write {path}: {message_of(exc)}") from exc

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
            await self.terminals.close()
            self._writer.close()


def _requests(events: list[Event]) -> list[tuple[int, int]]:
    """The requests of a saved session not undone since, as (turn, first step)."""
    found: list[tuple[int, int]] = []
    for event in events:
        if isinstance(event, TurnStarted):
            found.append((event.turn, event.first_step))
        elif isinstance(event, TurnsUndone):
            found = [r for r in found if r[0] < event.turn]
    return found


def _command_line(event: ApprovalRequested) -> str:
    """The command line a call runs ("" for a call that runs none: an editor's ``command`` is
    its action, not a command line)."""
    return str(event.arguments.get("command", "")) if event.name == "shell" else ""


def _repo_path(path: str) -> str | None:
    """A sandbox path as a path in the repository (None: outside the workspace)."""
    clean = posixpath.normpath(path)
    return clean[len(WORKSPACE) + 1 :] if clean.startswith(WORKSPACE + "/") else None


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
    command = _command_line(event)
    refused = f"`{command}`" if command else f"every `{action_of(event.name, event.arguments)}` call"
    texts.append(
        f"Reject always: refuses {refused} without asking, for the rest of the session. "
        "To say what to do instead, reject and send a message."
    )
    return texts
