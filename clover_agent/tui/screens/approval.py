"""An approval: a call the policy asks about, with the change it would make, and three answers."""

from __future__ import annotations

import json
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from clover_agent.agent.approvals import Answer
from clover_agent.tui.events import ApprovalNeeded
from clover_agent.tui.widgets.diff_view import DiffView
from clover_agent.tui.widgets.tool_card import summarize


class ApprovalScreen(ModalScreen[str]):
    """Dismissed with an :class:`~clover_agent.agent.approvals.Answer` (Esc denies)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "choose('once')", "Allow once"),
        Binding("a", "choose('always')", "Always"),
        Binding("n,escape", "choose('deny')", "Deny"),
    ]
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    ApprovalScreen > Vertical {
        width: 95%; max-width: 110; height: auto; max-height: 95%;
        border: round $warning; background: $surface; padding: 0 1;
    }
    ApprovalScreen .title { text-style: bold; color: $warning; }
    ApprovalScreen .reason { color: $text-muted; }
    ApprovalScreen VerticalScroll { height: auto; max-height: 14; }
    ApprovalScreen Horizontal { height: auto; align-horizontal: center; }
    ApprovalScreen Button { margin: 0 1; min-width: 14; }
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
            with Horizontal():
                yield Button("Allow once (y)", id="once", variant="success")
                yield Button("Always (a)", id="always", variant="primary")
                yield Button("Deny (n)", id="deny", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(Answer(event.button.id) if event.button.id in set(Answer) else Answer.DENY)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
