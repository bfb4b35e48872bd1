"""An approval: a call the policy asks about, with the change it would make, and its answers:
once, always (the dialog says what that allows), deny, or deny saying what to do instead (``f``
opens a line for it; Enter sends it to the model with the refusal, Esc goes back)."""

from __future__ import annotations

import json
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from clover_agent.agent.approvals import Answer, Reply
from clover_agent.session.events import ApprovalNeeded
from clover_agent.tui.widgets.diff_view import DiffView
from clover_agent.tui.widgets.tool_card import summarize


class FeedbackInput(Input):
    """The line for what to do instead; Esc closes it (the call is still waiting)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Back", show=False)]

    def action_close(self) -> None:
        screen = self.screen
        if isinstance(screen, ApprovalScreen):
            screen.close_feedback()


class ApprovalScreen(ModalScreen[Reply]):
    """Dismissed with a :class:`~clover_agent.agent.approvals.Reply` (Esc denies)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "choose('once')", "Allow once"),
        Binding("a", "choose('always')", "Always"),
        Binding("n,escape", "choose('deny')", "Deny"),
        Binding("f", "feedback", "Deny, saying what to do instead"),
    ]
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    ApprovalScreen > Vertical {
        width: 95%; max-width: 110; height: auto; max-height: 95%;
        border: round $warning; background: $surface; padding: 0 1;
    }
    ApprovalScreen .title { text-style: bold; color: $warning; }
    ApprovalScreen .reason, ApprovalScreen .always { color: $text-muted; }
    ApprovalScreen VerticalScroll { height: auto; max-height: 14; }
    ApprovalScreen Horizontal { height: auto; align-horizontal: center; }
    ApprovalScreen Button { margin: 0 1; min-width: 14; }
    ApprovalScreen FeedbackInput { display: none; }
    ApprovalScreen.-feedback FeedbackInput { display: block; }
    ApprovalScreen.-feedback Horizontal { display: none; }
    """

    def __init__(self, request: ApprovalNeeded) -> None:
        super().__init__()
        self.request = request

    def compose(self) -> ComposeResult:
        request = self.request
        with Vertical():
            yield Static(
                f"Allow {request.name}: {summarize(request.name, request.arguments, 80)}?",
                classes="title",
                markup=False,
            )
            yield Static(request.reason, classes="reason", markup=False)
            with VerticalScroll():
                if request.preview:
                    yield DiffView(request.preview)
                else:
                    yield Static(json.dumps(request.arguments, indent=2, ensure_ascii=False), markup=False)
            if request.always:
                yield Static(f"Always (a) allows {request.always}.", classes="always", markup=False)
            yield FeedbackInput(placeholder="Deny and say what to do instead · Enter sends · Esc back")
            with Horizontal():
                yield Button("Allow once (y)", id="once", variant="success")
                yield Button("Always (a)", id="always", variant="primary")
                yield Button("Deny (n)", id="deny", variant="error")
                yield Button("Deny, say why (f)", id="feedback", variant="warning")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "feedback":
            self.action_feedback()
        else:
            self.dismiss(Reply(Answer(event.button.id) if event.button.id in set(Answer) else Answer.DENY))

    def action_choose(self, choice: str) -> None:
        self.dismiss(Reply(Answer(choice)))

    def action_feedback(self) -> None:
        """Open the line for what to do instead (the keys y / a / n then type into it)."""
        self.add_class("-feedback")
        self.query_one(FeedbackInput).focus()

    def close_feedback(self) -> None:
        self.remove_class("-feedback")
        self.query_one(FeedbackInput).value = ""
        self.query_one("#deny", Button).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(Reply(Answer.DENY, event.value.strip()))
