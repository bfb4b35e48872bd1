"""The conversation as it happens: requests, thinking, replies, the diffusion view, tool cards.

:meth:`Transcript.show` takes the session's events one by one, in order, and turns them into
widgets; the same method redraws a resumed session from its saved events. The view stays scrolled
to the newest content until the person scrolls up (Textual's anchor; new output then says so, with
:class:`Transcript.Below`), and follows it again once they scroll back to the bottom.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.containers import VerticalScroll
from textual.message import Message

from clover_agent.events import (
    ApprovalDecided,
    CallInterrupted,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    HookRan,
    MessageAdded,
    ModelDelta,
    ModelResponded,
    PlanUpdated,
    ProvisionalBlock,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
    WorkspaceUndone,
)
from clover_agent.hooks import hook_line
from clover_agent.session.events import (
    MessageNotSent,
    MessageQueued,
    Notice,
    SandboxState,
    TurnStarted,
    TurnsUndone,
)
from clover_agent.tui.widgets.agent_text import AgentText
from clover_agent.tui.widgets.diffusion_view import DiffusionView
from clover_agent.tui.widgets.notice import NoticeLine
from clover_agent.tui.widgets.plan_view import PlanNote
from clover_agent.tui.widgets.results_table import TestTable
from clover_agent.tui.widgets.thinking import Thinking
from clover_agent.tui.widgets.tool_card import ToolCard
from clover_agent.tui.widgets.user_message import UserMessage


class Transcript(VerticalScroll):
    """See the module docstring. ``show_thinking`` keeps reasoning open once a turn completes."""

    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1 1 0; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.show_thinking = False
        self.token_text: Callable[[int], str] | None = None
        self._thinking: Thinking | None = None
        self._text: AgentText | None = None
        self._diffusion: DiffusionView | None = None
        self._cards: dict[str, ToolCard] = {}
        self._test_outcomes: dict[str, str] = {}  # the latest outcome of each test seen
        self._queued: list[UserMessage] = []
        self.new_below = False  # new output arrived below while the person reads above it
        self._reading = False  # the person scrolled up and has not come back to the bottom

    def on_mount(self) -> None:
        self.anchor()

    class Below(Message):
        """Whether new output arrived below the view while the person reads above it."""

        def __init__(self, waiting: bool) -> None:
            super().__init__()
            self.waiting = waiting

    def release_anchor(self) -> None:
        super().release_anchor()  # a scroll of the person's (keys, wheel, scrollbar), not a layout's
        self._reading = True

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y:  # back at the bottom
            self._reading = False
            self._set_below(False)

    def _check_below(self) -> None:
        if self._reading and self.max_scroll_y - self.scroll_y >= 1:
            self._set_below(True)

    def _set_below(self, waiting: bool) -> None:
        if waiting != self.new_below:
            self.new_below = waiting
            self.post_message(self.Below(waiting))

    def page(self, direction: int) -> None:
        """PageUp (``direction`` < 0) or PageDown; PageDown at the bottom keeps following (Textual
        takes the follow up again only when a scroll moves the view back to the bottom)."""
        if direction < 0:
            self.scroll_page_up()
        elif self.scroll_y >= self.max_scroll_y:
            self._reading = False
            self.scroll_end(animate=False)
        else:
            self.scroll_page_down()

    @property
    def cards(self) -> list[ToolCard]:
        return list(self.query(ToolCard))

    @property
    def diffusion(self) -> DiffusionView | None:
        return self._diffusion

    async def show(self, event: Event) -> None:
        """Draw ``event`` (events this view does not show are ignored)."""
        await self._show(event)
        self.call_after_refresh(self._check_below)

    async def _show(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            await self._end_stream()
            queued = next((m for m in self._queued if event.text in (m.text, m.sent)), None)
            if queued is not None:
                self._queued.remove(queued)
                queued.remove_class("-queued")
                queued.show(event.text, event.turn)
            else:
                await self.mount(UserMessage(event.text, event.turn))
        elif isinstance(event, MessageQueued):
            message = UserMessage(
                event.text + "  (queued: the agent reads it after its current call; Esc: now)", queued=True
            )
            message.text, message.sent = event.text, event.sent or event.text
            self._queued.append(message)
            await self.mount(message)
        elif isinstance(event, MessageNotSent):
            message = UserMessage(event.text + "  (not sent)", blocked=True)
            message.text = event.text
            await self.mount(message)
            waits = "; the agent still waits for your message" if event.waiting else ""
            await self.mount(
                NoticeLine(f"Your message was not sent to the model: {event.reason}{waits}.", "error")
            )
        elif isinstance(event, MessageAdded) and event.message.get("role") == "user":
            read = next((m for m in self._queued if m.sent == event.message.get("content")), None)
            if read is not None:  # the agent read a queued message
                self._queued.remove(read)
                read.remove_class("-queued")
                read.show(read.text, None)
        elif isinstance(event, CallInterrupted):
            await self._end_stream()
            card = self._cards.get(event.call_id or "")
            if card is not None:
                card.interrupted()
            during = "the model's reply" if event.during == "model" else f"the {event.name} call"
            await self.mount(
                NoticeLine(f"Interrupted {during}; the agent waits for your message.", "warning")
            )
        elif isinstance(event, WorkspaceUndone):
            await self.mount(
                NoticeLine(f"Workspace back to step {event.step}: undid {event.undone}", "warning")
            )
        elif isinstance(event, ModelDelta):
            await self._delta(event)
        elif isinstance(event, ProvisionalBlock):
            if self._diffusion is None:
                self._diffusion = DiffusionView(self.token_text)
                await self.mount(self._diffusion)
            elif self.children[-1] is not self._diffusion:
                self.move_child(self._diffusion, after=self.children[-1])
            self._diffusion.show_block(event)
        elif isinstance(event, ModelResponded):
            await self._responded(event)
        elif isinstance(event, ToolCallStarted):
            await self._end_stream()
            card = ToolCard(event.call_id, event.name, event.arguments)
            self._cards[event.call_id] = card
            await self.mount(card)
        elif isinstance(event, ToolOutput):
            card = self._cards.get(event.call_id)
            if card is not None:
                await card.stream(event.text)
        elif isinstance(event, ApprovalDecided):
            card = self._cards.get(event.call_id)
            if card is not None:
                card.decided(event.approved, event.decided_by, event.feedback)
        elif isinstance(event, ToolCallFinished):
            card = self._cards.get(event.call_id)
            if card is not None:
                report = (event.data or {}).get("report")
                known = report or event.name == "finish"  # finish: what the tests said when last run
                await card.finish(event, dict(self._test_outcomes) if known else None)
                if isinstance(report, dict):
                    self._test_outcomes.update(report.get("outcomes") or {})
        elif isinstance(event, TestsRun) and event.phase != "user":  # /apply's judging runs: one line
            report = event.report
            counts = f"{report.get('passed', 0)} passed, {report.get('failed', 0)} failed"
            await self.mount(
                NoticeLine(f"check: {event.phase.replace('_', ' ')} ({event.target or 'all'}): {counts}")
            )
        elif isinstance(event, TestsRun):
            await self.mount(NoticeLine(f"tests ({event.target or 'all'})"))
            await self.mount(TestTable(event.report, dict(self._test_outcomes) or None))
            self._test_outcomes.update(event.report.get("outcomes") or {})
        elif isinstance(event, Notice):
            await self.mount(NoticeLine(event.text, event.level))
        elif isinstance(event, PlanUpdated) and event.stage == "proposed":  # then: the plan view
            await self.mount(PlanNote(event))
        elif isinstance(event, ErrorReported) and not event.fatal:
            await self.mount(NoticeLine(f"{event.kind}: {event.message}", "warning"))
        elif isinstance(event, HookRan) and (line := hook_line(event)) is not None:
            await self.mount(NoticeLine(f"hook: {line}", "warning" if event.failed else "info"))
        elif isinstance(event, ContextCondensed):
            await self.mount(NoticeLine(f"context: {event.note}"))
        elif isinstance(event, SandboxState) and event.state == "failed":
            await self.mount(NoticeLine(f"The {event.kind} sandbox did not start: {event.message}", "error"))
        elif isinstance(event, SandboxState) and event.state == "ready" and event.message:
            await self.mount(NoticeLine(event.message, "warning"))
        elif isinstance(event, TurnsUndone):
            for message in self.query(UserMessage):
                if message.turn is not None and message.turn >= event.turn:
                    message.add_class("-undone")
            files = ", ".join(event.files) or "no file"
            await self.mount(NoticeLine(f"Undid request {event.turn} and later: {files} put back", "warning"))
        elif isinstance(event, Done):
            await self._end_stream()
            for card in self._cards.values():
                if card.result is None:
                    card.note("interrupted", "-error")
            if event.outcome in ("answered", "planned"):  # the reply, or the plan (above), is the end
                return
            text = event.summary or event.message
            level = (
                "done"
                if event.outcome == "submitted"
                else "error"
                if event.outcome != "interrupted"
                else "warning"
            )
            await self.mount(NoticeLine(text, level))

    async def _delta(self, event: ModelDelta) -> None:
        if self._diffusion is not None:
            self._diffusion.commit()
        if event.kind == "reasoning":
            if self._thinking is None:
                self._thinking = Thinking(keep_open=self.show_thinking)
                await self._mount_before_diffusion(self._thinking)
            self._thinking.feed(event.text)
        else:
            if self._text is None:
                self._text = AgentText()
                await self._mount_before_diffusion(self._text)
            await self._text.feed(event.text)

    async def _mount_before_diffusion(self, widget: Thinking | AgentText) -> None:
        if self._diffusion is not None and self.children[-1] is self._diffusion:
            await self.mount(widget, before=self._diffusion)
        else:
            await self.mount(widget)

    async def _responded(self, event: ModelResponded) -> None:
        if self._diffusion is not None:
            self._diffusion.commit()
        if event.reasoning and event.reasoning.strip():
            if self._thinking is None:
                self._thinking = Thinking(keep_open=self.show_thinking)
                await self._mount_before_diffusion(self._thinking)
            self._thinking.finish(event.reasoning)
        elif self._thinking is not None:
            self._thinking.finish(None)
        if event.content.strip() or self._text is not None:
            if self._text is None:
                self._text = AgentText()
                await self._mount_before_diffusion(self._text)
            await self._text.finish(event.content)
        self._thinking, self._text = None, None

    async def _end_stream(self) -> None:
        """A turn's streamed parts are complete (a tool call or the end came)."""
        if self._text is not None:
            await self._text.finish(self._text.shown)
        if self._thinking is not None:
            self._thinking.finish(None)
        if self._diffusion is not None:
            self._diffusion.commit()
        self._thinking, self._text = None, None

    def set_show_thinking(self, show: bool) -> None:
        self.show_thinking = show
        for thinking in self.query(Thinking):
            thinking.keep_open = show
            if thinking.title != "Thinking…":
                thinking.collapsed = not show

    async def expand_newest(self) -> None:
        """Expand (or fold again) the newest card with a folded body."""
        focused = self.app.focused
        if isinstance(focused, ToolCard):
            await focused.action_toggle_fold()
            return
        for card in reversed(self.cards):
            if card.foldable:
                await card.action_toggle_fold()
                return

    async def clear(self) -> None:
        await self.remove_children()
        self._reading = False
        self._set_below(False)
        self._thinking = self._text = self._diffusion = None
        self._cards.clear()
        self._queued.clear()
