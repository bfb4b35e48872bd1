"""The Textual app: the transcript, the prompt, the status line, and the commands.

"Attributes down, messages up": the session (:class:`~clover_agent.tui.session.TuiSession`, in its
own thread) delivers every event as an :class:`AgentEvent` message; the app hands it to the
transcript and the status bar, and opens the approval dialog when one is needed. What the person
does goes back to the session as method calls that return futures; the app awaits them without
ever blocking its event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import shlex
import subprocess
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static, TextArea

from clover_agent.agent.approvals import Answer, Reply
from clover_agent.agent.plan import Plan
from clover_agent.agent.trajectory import TRAJECTORY_FILE, read_events
from clover_agent.errors import RUN_ERRORS, CloverError, message_of
from clover_agent.events import CallInterrupted, Done, Event, ProvisionalBlock, ToolOutput
from clover_agent.handback.session import Offer
from clover_agent.session.assembly import SessionConfig
from clover_agent.session.events import ApprovalNeeded, MessageNotSent, Notice, SessionStarted
from clover_agent.session.store import SessionInfo, load_session
from clover_agent.tui.export import transcript_markdown
from clover_agent.tui.keys import COMMANDS, KEYS, parse_command
from clover_agent.tui.palette import SlashCommands
from clover_agent.tui.policies import POLICIES
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.screens.approval import ApprovalScreen
from clover_agent.tui.screens.diff import DiffScreen
from clover_agent.tui.screens.help import HelpScreen
from clover_agent.tui.screens.picker import PickerScreen, session_picker, undo_picker
from clover_agent.tui.screens.plan import PlanChoice, PlanScreen
from clover_agent.tui.screens.quit import QuitScreen
from clover_agent.tui.session import TuiSession
from clover_agent.tui.text import printable_event
from clover_agent.tui.widgets.activity import ActivityLine
from clover_agent.tui.widgets.key_hints import KeyHints
from clover_agent.tui.widgets.path_menu import PathMenu
from clover_agent.tui.widgets.plan_view import PlanView
from clover_agent.tui.widgets.prompt import PromptBox
from clover_agent.tui.widgets.status_bar import StatusBar
from clover_agent.tui.widgets.transcript import Transcript
from clover_agent.tui.widgets.welcome import Welcome

T = TypeVar("T")
THEMES = {"dark": "textual-dark", "light": "textual-light"}
PLACEHOLDER = "Ask for a change · Enter sends · ctrl+j new line · @path · / commands · ? keys"
QUIT_HINT = "Press ctrl+c again to quit (ctrl+q quits at once)."


class AgentEvent(Message):
    """An event of the session, posted from its thread."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


def _repository_files(repo: Path) -> list[str]:
    """The files ``@`` completes: tracked and untracked-but-not-ignored ones."""
    listing = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:
        return sorted(
            str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts
        )
    return sorted(p for p in listing.stdout.split("\0") if p and not p.startswith(".clover/"))


class CloverApp(App[int]):
    """The TUI. ``options``: the session to run; ``pick_from``: saved sessions to choose from
    first (``--resume`` without an id; Esc in the picker starts a new session)."""

    TITLE = "clover-agent"
    COMMANDS = App.COMMANDS | {SlashCommands}  # the palette's providers (the slash commands: keys.COMMANDS)
    BINDINGS: ClassVar[list[BindingType]] = [
        # Escape stays below the dialogs' own bindings; the others win over the prompt's (ctrl+d there
        # deletes forward, ctrl+c copies).
        *(
            Binding(key.keys, key.action, key.description, show=False, priority=key.action != "interrupt")
            for key in KEYS
            if key.action and key.action != "scroll_transcript"
        ),
        Binding("pageup", "scroll_transcript(-1)", "scroll up", show=False, priority=True),
        Binding("pagedown", "scroll_transcript(1)", "scroll down", show=False, priority=True),
    ]
    CSS = """
    Screen { layout: vertical; }
    #new-below { display: none; height: 1; padding: 0 1; color: $accent; text-style: bold; }
    #new-below.-shown { display: block; }
    """

    def __init__(
        self, options: SessionConfig, *, pick_from: list[SessionInfo] | None = None, theme: str = "dark"
    ) -> None:
        super().__init__()
        self.options = options
        self.pick_from = pick_from or []
        self.initial_theme = THEMES.get(theme, THEMES["dark"])
        self.session: TuiSession | None = None
        self.events: list[Event] = []  # every event shown but output pieces, in order (tests, /export)
        self._closed = False
        self._quit_armed = False  # ctrl+c was pressed once on an idle, empty prompt
        self._quit_confirmed = False  # quit although changes are not applied (the quit dialog's q)
        self._pending: list[str] = []  # the changed files not applied, as quitting found them
        #: Printed at the shell once the app has quit: how to continue the session, what it holds.
        self.exit_note = ""
        self.menu = PathMenu(id="path-menu")  # the prompt's completion menu
        self.hints = KeyHints(id="key-hints")

    # -- layout ----------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        menu = self.menu
        yield Transcript(id="transcript")
        yield Static("↓ new output below · PageDown to follow it", id="new-below")
        yield PlanView(id="plan-view")
        yield ActivityLine(id="activity")
        yield menu
        yield PromptBox(menu, placeholder=PLACEHOLDER, id="prompt")
        yield StatusBar()
        yield self.hints

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptBox:
        return self.query_one(PromptBox)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def plan_view(self) -> PlanView:
        return self.query_one(PlanView)

    async def on_mount(self) -> None:
        self.screen_change_signal.subscribe(self, lambda screen: self._show_hints())  # dialogs' keys
        self.theme = self.initial_theme
        self.prompt.focus()
        self._load_files()
        if self.pick_from:
            self.push_screen(session_picker(self.pick_from), self._picked)
        else:
            await self.start_session()

    async def _picked(self, session_id: str | None) -> None:
        if session_id is not None:
            try:
                assert self.options.record_key is not None, "a picker lists signed sessions only"
                self.options.resume = load_session(self.options.repo, session_id, self.options.record_key)
            except CloverError as exc:
                await self.transcript.show(Notice(text=exc.message, level="error"))
        await self.start_session()

    async def start_session(self) -> None:
        """Start the session (its sandbox starts now, while the person types)."""
        saved = self.options.resume
        if saved is None:
            await self.transcript.mount(Welcome())
        else:
            for event in saved.events:
                if not isinstance(event, ProvisionalBlock | ApprovalNeeded):
                    await self._show(event)
            await self.transcript.show(Notice(text=f"Resumed session {saved.info.session_id}."))
            if saved.info.draft and not self.prompt.text:
                self.prompt.load_text(saved.info.draft)
                self.prompt.move_cursor(self.prompt.document.end)
                await self.transcript.show(Notice(text="Your unsent draft is back in the prompt."))
        self.session = TuiSession(self.options, self._deliver)
        self.sub_title = self.session.session_id

    @work(thread=True, exclusive=True, group="files")
    def _load_files(self) -> None:
        files = _repository_files(self.options.repo)
        self.call_from_thread(setattr, self.prompt, "files", files)

    # -- events from the session -------------------------------------------------------------------

    async def _show(self, event: Event) -> None:
        if not isinstance(event, ToolOutput):  # its call's ToolCallFinished holds what it held
            self.events.append(event)
        shown = printable_event(event)  # no control character from the model or a tool reaches the terminal
        await self.transcript.show(shown)
        self.status_bar.observe(shown)
        self.plan_view.observe(shown)

    def on_transcript_below(self, message: Transcript.Below) -> None:
        self.query_one("#new-below").set_class(message.waiting, "-shown")

    def _deliver(self, event: Event) -> None:
        """The session's events, from the agent's thread, into the app's message queue."""
        self.post_message(AgentEvent(event))

    async def on_agent_event(self, message: AgentEvent) -> None:
        event = message.event
        if isinstance(event, SessionStarted) and self.session is not None:
            tokenizer = getattr(self.session.backend, "tokenizer", None)
            if tokenizer is not None:
                self.transcript.token_text = lambda token: tokenizer.decode([token])
        await self._show(event)
        self.query_one(ActivityLine).observe(printable_event(event))  # live events only
        self._show_hints()
        screen = self.screen
        if (
            isinstance(event, CallInterrupted)
            and isinstance(screen, ApprovalScreen)
            and screen.request.call_id == event.call_id  # the approval it waited for
        ):
            screen.dismiss(None)
        if isinstance(event, Done) and event.outcome == "planned" and event.plan is not None:
            self._offer_plan(Plan.from_dict(event.plan))
        if isinstance(event, MessageNotSent):
            await self._put_back(event.text)
        if isinstance(event, ApprovalNeeded):
            card = next((c for c in self.transcript.cards if c.call_id == event.call_id), None)
            if card is not None:
                card.note("waiting for your approval", "-waiting")
            self.push_screen(
                ApprovalScreen(printable_event(event)), lambda choice: self._answer(event.call_id, choice)
            )
            self._show_hints()

    async def _put_back(self, text: str) -> None:
        """A message that was not sent goes back in the prompt, to edit, unless the person is typing
        another (then Up, the prompt's history, brings it back)."""
        if self.prompt.text.strip():
            await self._note("Up in the prompt brings your message back.")
            return
        self.prompt.load_text(text)
        self.prompt.move_cursor(self.prompt.document.end)
        await self._note("Your message is back in the prompt: edit it before sending it again.")

    def _answer(self, call_id: str, reply: Reply | None) -> None:
        if self.session is not None:
            reply = reply or Reply(Answer.DENY)
            self.session.answer(call_id, reply.answer, reply.feedback)
        self.call_after_refresh(self._show_hints)  # once the dialog is gone

    def _show_hints(self) -> None:
        """The key hints for now: an approval waits, the completion menu is open, the agent runs."""
        top = self.screen_stack[-1] if self.screen_stack else None
        if any(isinstance(screen, ApprovalScreen) for screen in self.screen_stack):
            state = "approval"
        elif isinstance(top, ApplyScreen):
            state = "apply"
        elif isinstance(top, PlanScreen) and top.choices:
            state = "plan"
        elif isinstance(top, HelpScreen | DiffScreen | PlanScreen):
            state = "view"
        elif isinstance(top, PickerScreen):
            state = "picker"
        elif isinstance(top, QuitScreen):
            state = "quit"
        elif self.menu.is_open:
            state = "menu"
        elif self._agent_working():
            state = "running"
        else:
            state = "idle"
        self.hints.show_state(state)

    def _agent_working(self) -> bool:
        """A request runs and the agent is not waiting (False once the app's screen is torn down:
        a dialog's dismissal may come after the main screen's widgets are gone)."""
        bars = self.query(StatusBar)
        return bool(bars) and bars.first().busy and not bars.first().waiting

    def on_path_menu_toggled(self, message: PathMenu.Toggled) -> None:
        self._show_hints()

    # -- the prompt --------------------------------------------------------------------------------

    async def on_prompt_box_submitted(self, message: PromptBox.Submitted) -> None:
        command = parse_command(message.text)
        if command is not None:
            await self.run_command(*command)
            return
        if self.session is None:
            await self.transcript.show(Notice(text="No session is running.", level="error"))
            return
        self._watch(self.session.send(message.text))

    def _watch(self, future: concurrent.futures.Future[Any]) -> None:
        """Report a failure of background work in the transcript."""

        def done(f: concurrent.futures.Future[Any]) -> None:
            if f.cancelled():
                return
            error = f.exception()
            if error is not None:
                text = (
                    message_of(error) if isinstance(error, RUN_ERRORS) else f"{type(error).__name__}: {error}"
                )
                self.post_message(AgentEvent(Notice(text=text, level="error")))

        future.add_done_callback(done)

    async def _call(self, future: concurrent.futures.Future[T]) -> T | None:
        """Await work of the session; any layer's error (``RUN_ERRORS``) becomes a notice (and None)."""
        try:
            return await asyncio.wrap_future(future)
        except RUN_ERRORS as exc:
            await self.transcript.show(Notice(text=message_of(exc), level="error"))
            return None

    async def _note(self, text: str, level: str = "info") -> None:
        await self.transcript.show(Notice(text=text, level=level))

    # -- commands ----------------------------------------------------------------------------------

    async def run_command(self, name: str, argument: str) -> None:
        handler = getattr(self, f"_command_{name}", None)
        if handler is None or name not in {c.name for c in COMMANDS}:
            await self._note(f"Unknown command /{name}; /help lists them.", "error")
            return
        if self.session is None and name not in ("help", "quit"):
            await self._note("No session is running.", "error")
            return
        await handler(argument)

    async def _command_help(self, argument: str) -> None:
        self.push_screen(HelpScreen())

    async def _command_quit(self, argument: str) -> None:
        await self.action_quit()

    async def _command_diff(self, argument: str) -> None:
        assert self.session is not None
        diff = await self._call(self.session.run(self.session.diff()))
        if diff is not None:
            self.push_screen(DiffScreen(diff))

    async def _command_apply(self, argument: str) -> None:
        session = self.session
        assert session is not None
        await self._note(
            "Checking the session's changes as `fix` does: held out, in a fresh sandbox (the tests run)…"
        )
        found = await self._call(session.run(session.changes()))
        if found is None:  # an error, shown
            return
        if not found:
            await self._note("Nothing to apply: the workspace has no change that is not in your tree yet.")
            return
        self._offer_apply(found[0], markers=argument.strip() == "markers")

    def _offer_apply(self, offer: Offer, *, markers: bool = False) -> None:
        """The apply dialog for ``offer``; a part of it chosen is judged on its own and offered again."""
        session = self.session
        assert session is not None

        async def chosen(accepted: list | None) -> None:
            if not accepted:
                await self._note("Nothing applied.")
                return
            paths = [change.path for change in accepted]
            if set(paths) != set(offer.patch.files):
                await self._note(
                    f"Checking the {len(paths)} chosen file(s) on their own (held out, in a fresh sandbox)…"
                )
                part = await self._call(session.run(session.part(offer, paths)))
                if part is not None:
                    self._offer_apply(part, markers=markers)
                return
            await self._call(session.run(session.apply(offer, markers=markers)))

        self.push_screen(ApplyScreen(offer.files, offer.verdict, offer.review), chosen)

    async def _command_undo(self, argument: str) -> None:
        session = self.session
        assert session is not None
        if argument:
            if not argument.isdigit():
                await self._note("/undo takes a request number, e.g. /undo 2", "error")
                return
            await self._call(session.run(session.undo(int(argument))))
            return
        turns = await self._call(session.run(session.undoable()))
        if not turns:
            await self._note("Nothing to undo: no request changed the workspace (since the sandbox started).")
            return

        async def picked(turn: str | None) -> None:
            if turn is not None:
                await self._call(session.run(session.undo(int(turn))))

        self.push_screen(undo_picker(turns), picked)

    async def _command_tests(self, argument: str) -> None:
        session = self.session
        assert session is not None
        await self._note(f"Running {argument or 'all tests'} in the sandbox…")
        self._watch(session.run(session.run_tests(argument or None)))

    async def _command_plan(self, argument: str) -> None:
        session = self.session
        assert session is not None
        choice = argument.lower()
        if choice == "show":
            plan, stage = self.plan_view.plan, self.plan_view.stage
            if plan is None:
                await self._note("No plan yet: /plan (or shift+tab) turns plan mode on.")
            elif stage == "proposed" and session.planning:  # still to be judged
                self._offer_plan(Plan.from_dict(plan))
            else:
                self.push_screen(PlanScreen(Plan.from_dict(plan), session.policy.name, choices=False))
            return
        if choice not in ("", "on", "off"):
            await self._note("/plan takes on, off or show, e.g. /plan show", "error")
            return
        on = not session.planning if not choice else choice == "on"
        await self._call(session.run(session.set_planning(on)))

    def _offer_plan(self, plan: Plan) -> None:
        """The plan dialog for a proposed ``plan``: approved, edited, rejected or plan mode left."""
        session = self.session
        assert session is not None

        async def chosen(choice: PlanChoice | None) -> None:
            if choice is None:
                await self._note("The plan waits: /plan show brings it back; a message asks for another.")
            elif choice.action == "approve":
                self.status_bar.set_policy(choice.policy)
                self._watch(session.approve(choice.plan, choice.policy))
            elif choice.action == "leave":
                await self._call(session.run(session.set_planning(False)))
            elif choice.note:  # rejected, saying what to change: the agent plans again
                self._watch(session.send(choice.note))
            else:
                await self._note("Plan rejected; still in plan mode: say what to change.")
            self.call_after_refresh(self._show_hints)

        self.push_screen(PlanScreen(plan, session.policy.name), chosen)
        self._show_hints()

    async def _command_policy(self, argument: str) -> None:
        session = self.session
        assert session is not None
        if not argument:
            await self._note(f"Policy: {session.policy.name} (choices: {', '.join(POLICIES)}).")
            return
        policy = await self._call(session.run(session.set_policy(argument)))
        if policy is not None:
            self.status_bar.set_policy(policy.name)

    async def _command_model(self, argument: str) -> None:
        session = self.session
        assert session is not None
        status = session.status
        window = f", context window {status.context_window} tokens" if status.context_window else ""
        await self._note(f"Backend {status.backend or '(starting)'}{window}.")

    async def _command_usage(self, argument: str) -> None:
        for line in self.status_bar.usage.lines():
            await self._note(line)

    async def _command_mcp(self, argument: str) -> None:
        session = self.session
        assert session is not None
        configs = session.options.mcp_servers
        if not configs:
            await self._note("No MCP servers: add [mcp_servers.NAME] to your settings (docs/mcp.md).")
            return
        if session.mcp is None:
            names = ", ".join(f"`{c.name}`" for c in configs)
            await self._note(f"MCP servers {names}: they start with the sandbox, which is not up yet.")
            return
        for state in session.mcp.states.values():
            if state.state == "failed":
                await self._note(f"MCP `{state.name}` ({state.where}): failed: {state.error}", "warning")
                continue
            tools = ", ".join(state.tools) or "no tools"
            await self._note(
                f"MCP `{state.name}` ({state.where}): {state.now}; {len(state.tools)} tool(s): {tools}"
            )

    async def _command_sandbox(self, argument: str) -> None:
        session = self.session
        assert session is not None
        choice = argument.lower()
        if choice not in ("retry", "local", "docker"):
            await self._note("/sandbox takes retry, local or docker, e.g. /sandbox retry", "error")
            return
        kind = None if choice == "retry" else choice
        self._watch(session.run(session.restart_sandbox(kind)))

    async def _command_clear(self, argument: str) -> None:
        session = self.session
        assert session is not None
        if not await self._call(session.run(session.clear())):
            return
        await self.transcript.clear()
        await self._note("New conversation; the workspace keeps its changes (/diff shows them).")

    async def _command_export(self, argument: str) -> None:
        session = self.session
        assert session is not None
        target = Path(argument).expanduser() if argument else session.folder / "transcript.md"
        trajectory = session.folder / TRAJECTORY_FILE

        def write() -> None:
            target.write_text(transcript_markdown(read_events(trajectory)), encoding="utf-8")

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            await self._note(f"Could not write {target}: {exc.strerror or exc}", "error")
            return
        await self._note(f"Transcript written to {target}.")

    # -- actions -----------------------------------------------------------------------------------

    def action_interrupt(self) -> None:
        if self.session is not None:
            self.session.interrupt()

    async def action_ctrl_c(self) -> None:
        """Never loses work: copies a selection, else clears a non-empty prompt (its text stays in the
        history), else interrupts a running request; on an idle, empty prompt the first press only
        says how to quit and the second quits (any other key in between starts over)."""
        focused = self.focused
        selected = focused.selected_text if isinstance(focused, TextArea) else ""
        selected = selected or (self.screen.get_selected_text() or "")
        if selected:
            self.copy_to_clipboard(selected)
            self.notify("Copied.", timeout=2)
            return
        if self.prompt.text.strip() and len(self.screen_stack) == 1:  # not behind a dialog
            self.action_clear_prompt()
            return
        if self.session is not None and self.session.busy:
            self.session.interrupt()
            return
        if self._quit_armed:
            await self.action_quit()
            return
        self._quit_armed = True
        self.notify(QUIT_HINT, timeout=10)

    def action_clear_prompt(self) -> None:
        if self.prompt.clear_keeping_history():
            self.notify("Prompt cleared; up brings the text back.", timeout=3)

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:
            if event.key != "ctrl+c":
                self._quit_armed = False  # a quit takes two ctrl+c in a row
            self._type_into_prompt(event)
        await super().on_event(event)

    def _type_into_prompt(self, key: events.Key) -> None:
        """Typing goes to the prompt, wherever a click or a key left the focus on the main screen."""
        if len(self.screen_stack) != 1 or not (key.is_printable or key.key == "backspace"):
            return
        prompts = self.query(PromptBox)
        if prompts and self.focused is not prompts.first():
            self.screen.set_focus(prompts.first())  # at once: this key goes to the prompt

    async def action_toggle_plan(self) -> None:
        if self.session is not None:
            await self._command_plan("")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "toggle_plan":  # a dialog's own shift+tab moves its focus
            return len(self.screen_stack) == 1
        return True

    def action_toggle_thinking(self) -> None:
        self.transcript.set_show_thinking(not self.transcript.show_thinking)

    async def action_expand(self) -> None:
        await self.transcript.expand_newest()

    async def action_diff(self) -> None:
        if self.session is not None:
            await self._command_diff("")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = THEMES["light"] if self.current_theme.dark else THEMES["dark"]

    def action_scroll_transcript(self, direction: int) -> None:
        # A dialog on top (help, /diff, an approval) owns the page keys: they scroll it, not the
        # transcript behind it.
        if len(self.screen_stack) > 1:
            scrolls = self.screen.query(VerticalScroll)
            if scrolls:
                view = scrolls.first()
                view.scroll_page_down() if direction > 0 else view.scroll_page_up()
            return
        self.transcript.page(direction)

    async def action_quit(self) -> None:
        """Quit; with changes your tree does not hold yet, first say which (the quit dialog)."""
        if not self._quit_confirmed:
            self._pending = await self._unapplied()
            if self._pending and not isinstance(self.screen, QuitScreen):
                self.push_screen(QuitScreen(self._pending, self._resume_command()), self._quit_answer)
                return
        await self._close_session(self._pending)
        self.exit(0)

    async def _quit_answer(self, answer: str | None) -> None:
        if answer == "quit":
            self._quit_confirmed = True
            await self.action_quit()
        elif answer == "apply":
            await self.run_command("apply", "")

    async def _unapplied(self) -> list[str]:
        """The files the session changed that your tree does not hold yet ([] when it cannot tell)."""
        session = self.session
        if session is None or self._closed:
            return []

        def look() -> list[str]:
            return session.run(session.unapplied()).result(timeout=20)

        try:
            return await asyncio.to_thread(look)
        except (*RUN_ERRORS, OSError, concurrent.futures.TimeoutError, RuntimeError):
            return []

    def _resume_command(self) -> str:
        assert self.session is not None
        repo = (
            ""
            if self.options.repo.resolve() == Path.cwd().resolve()
            else f" --repo {shlex.quote(str(self.options.repo))}"
        )
        return f"clover-agent tui --resume {self.session.session_id}{repo}"

    async def _close_session(self, pending: list[str] | None = None) -> None:
        if self._closed or self.session is None:
            return
        if self.session.info.requests or pending:
            held = f" ({len(pending)} changed file(s) not applied)" if pending else ""
            self.exit_note = (
                f"Session {self.session.session_id} saved{held}. Continue it: {self._resume_command()}"
            )
        self._closed = True
        for bar in self.query(StatusBar):
            bar.sandbox = "closing"
            bar.refresh_line()
        prompts = self.query(PromptBox)
        draft = prompts.first().text if prompts else ""
        session = self.session

        def close() -> None:
            with contextlib.suppress(*RUN_ERRORS, OSError, concurrent.futures.TimeoutError):
                session.run(session.save_draft(draft)).result(timeout=10)  # restored on resume
            session.close()

        await asyncio.to_thread(close)

    async def on_unmount(self) -> None:
        await self._close_session()
