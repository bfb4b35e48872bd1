"""A proposed plan, for the person to judge: approve it (under the policy chosen here, by default the
one the session had before planning), edit it first (its Markdown in an editor, read back with
:func:`~clover_agent.agent.plan.parse_plan`), reject it saying what to change (the agent plans again,
still read-only), or leave plan mode. The plan is the model's text: shown as text, never as markup,
its control characters made visible."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Select, Static, TextArea

from clover_agent.agent.plan import Plan, parse_plan
from clover_agent.errors import UsageError
from clover_agent.tui.policies import POLICIES
from clover_agent.tui.text import printable


@dataclass
class PlanChoice:
    """What the person chose: ``approve`` (``plan`` under ``policy``), ``reject`` (``note``: what to
    change, "" to say it later) or ``leave`` (plan mode)."""

    action: str
    plan: Plan
    policy: str = ""
    note: str = ""


class ChangeInput(Input):
    """The line for what to change; Esc goes back to the choices."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Back", show=False)]

    def action_close(self) -> None:
        screen = self.screen
        if isinstance(screen, PlanScreen):
            screen.show_choices()


class PlanEditor(TextArea):
    """The plan's Markdown, edited; ctrl+s keeps it (when it reads as a plan), Esc drops it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "keep", "Keep the edit", show=False, priority=True),
        Binding("escape", "drop", "Drop the edit", show=False),
    ]

    def action_keep(self) -> None:
        screen = self.screen
        if isinstance(screen, PlanScreen):
            screen.keep_edit(self.text)

    def action_drop(self) -> None:
        screen = self.screen
        if isinstance(screen, PlanScreen):
            screen.show_choices()


class PlanScreen(ModalScreen[PlanChoice | None]):
    """Dismissed with a :class:`PlanChoice`, or None (Esc: stay in plan mode, decide later with
    ``/plan show``). ``choices=False``: the plan only, to read (an approved one)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "approve", "Approve"),
        Binding("e", "edit", "Edit"),
        Binding("r", "reject", "Reject, say what to change"),
        Binding("l", "leave", "Leave plan mode"),
        Binding("escape", "dismiss(None)", "Decide later"),
    ]
    AUTO_FOCUS = "#approve"  # Enter approves; the policy is one shift+tab away
    DEFAULT_CSS = """
    PlanScreen { align: center middle; }
    PlanScreen > Vertical {
        width: 95%; max-width: 110; height: auto; max-height: 95%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    PlanScreen .title { text-style: bold; color: $accent; }
    PlanScreen .error { color: $error; display: none; }
    PlanScreen.-error .error { display: block; }
    PlanScreen VerticalScroll { height: auto; max-height: 20; }
    PlanScreen PlanEditor { height: 16; display: none; }
    PlanScreen.-editing PlanEditor { display: block; }
    PlanScreen.-editing VerticalScroll, PlanScreen.-editing Horizontal { display: none; }
    PlanScreen ChangeInput { display: none; }
    PlanScreen.-rejecting ChangeInput { display: block; }
    PlanScreen.-rejecting Horizontal { display: none; }
    PlanScreen Horizontal { height: auto; align-horizontal: center; }
    PlanScreen Button { margin: 0 1; min-width: 12; }
    PlanScreen Select { width: 24; }
    """

    def __init__(self, plan: Plan, policy: str, *, choices: bool = True) -> None:
        super().__init__()
        self.plan = plan
        self.policy = policy if policy in POLICIES else next(iter(POLICIES))
        self.choices = choices
        self.edited = False

    def compose(self) -> ComposeResult:
        with Vertical():
            title = "The agent proposes this plan" if self.choices else "The plan"
            yield Static(f"{title} (Esc closes)", classes="title", markup=False)
            with VerticalScroll():
                yield Static(self.shown(), id="plan-text", markup=False)
            yield Static("", classes="error", id="plan-error", markup=False)
            if not self.choices:
                return
            yield PlanEditor("", soft_wrap=True, id="plan-editor")
            yield ChangeInput(placeholder="What to change · Enter sends it (plan mode goes on) · Esc back")
            with Horizontal():
                yield Select([(name, name) for name in POLICIES], value=self.policy, allow_blank=False)
                yield Button("Approve (a)", id="approve", variant="success")
                yield Button("Edit (e)", id="edit", variant="primary")
                yield Button("Reject (r)", id="reject", variant="warning")
                yield Button("Leave plan mode (l)", id="leave")

    def shown(self) -> Text:
        return Text(printable(self.plan.markdown()))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.choices or action not in ("approve", "edit", "reject", "leave")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        getattr(self, f"action_{event.button.id}")()

    def on_select_changed(self, event: Select.Changed) -> None:
        if isinstance(event.value, str):
            self.policy = event.value

    def action_approve(self) -> None:
        self.dismiss(PlanChoice("approve", self.plan, self.policy))

    def action_edit(self) -> None:
        editor = self.query_one(PlanEditor)
        editor.load_text(printable(self.plan.markdown()))  # what is approved is what was seen
        self.add_class("-editing")
        editor.focus()

    def keep_edit(self, text: str) -> None:
        """The edited Markdown, read as a plan: shown for approval, or why it is not one."""
        try:
            plan = parse_plan(text)
        except UsageError as exc:
            self.query_one("#plan-error", Static).update(f"Not kept: {exc.message}")
            self.add_class("-error")
            return
        self.plan, self.edited = plan, True
        self.query_one("#plan-text", Static).update(self.shown())
        self.show_choices()

    def action_reject(self) -> None:
        self.add_class("-rejecting")
        self.query_one(ChangeInput).focus()

    def action_leave(self) -> None:
        self.dismiss(PlanChoice("leave", self.plan))

    def show_choices(self) -> None:
        self.remove_class("-editing", "-rejecting", "-error")
        self.query_one(ChangeInput).value = ""
        self.query_one("#approve", Button).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(PlanChoice("reject", self.plan, note=event.value.strip()))
