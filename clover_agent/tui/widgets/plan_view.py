"""The plan being carried out, above the prompt: its summary, how many steps are done, and each step
(✓ done, ▸ in progress, · pending), redrawn from the ``PlanUpdated`` events (a resumed session's
too). Hidden while no plan is approved; a proposal is shown in the plan dialog instead."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from clover_agent.events import Event, PlanUpdated

MARKS = {"completed": ("✓", "green"), "in_progress": ("▸", "bold yellow"), "pending": ("·", "dim")}
MAX_STEPS_SHOWN = 8


def plan_lines(plan: dict[str, Any]) -> Text:
    """The plan's summary line and its steps, each with its mark (text, never markup)."""
    steps = [s for s in plan.get("steps") or [] if isinstance(s, dict)]
    done = sum(s.get("status") == "completed" for s in steps)
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append(f"Plan {done}/{len(steps)}", style="bold")
    out.append(f"  {' '.join(str(plan.get('summary', '')).split())}")
    # the step in progress stays in view: the window of steps shown starts before it
    current = next((n for n, s in enumerate(steps) if s.get("status") != "completed"), len(steps))
    first = max(0, min(current - 1, len(steps) - MAX_STEPS_SHOWN))
    for step in steps[first : first + MAX_STEPS_SHOWN]:
        mark, style = MARKS.get(str(step.get("status")), MARKS["pending"])
        out.append("\n")
        out.append(f"{mark} ", style=style)
        out.append(" ".join(str(step.get("step", "")).split()), style="dim" if mark == "✓" else "")
    hidden = len(steps) - min(len(steps), MAX_STEPS_SHOWN)
    if hidden:
        out.append(
            f"\n  ({hidden} more step{'s' if hidden > 1 else ''}: /plan show lists them all)", style="dim"
        )
    return out


class PlanNote(Static):
    """In the transcript: a plan proposed, with its steps."""

    DEFAULT_CSS = """
    PlanNote { padding: 0 1; margin: 0 0 1 0; border-left: thick $accent; }
    """

    def __init__(self, event: PlanUpdated) -> None:
        steps = [s for s in event.plan.get("steps") or [] if isinstance(s, dict)]
        text = Text("Plan proposed", style="bold")
        text.append(f": {' '.join(str(event.plan.get('summary', '')).split())}", style="not bold")
        for n, step in enumerate(steps, 1):
            text.append(f"\n{n}. {' '.join(str(step.get('step', '')).split())}", style="not bold")
        super().__init__(text, markup=False)


class PlanView(Static):
    """Observes events (:meth:`observe`); ``plan`` and ``stage`` are the latest ``PlanUpdated``'s."""

    DEFAULT_CSS = """
    PlanView { display: none; height: auto; max-height: 11; padding: 0 1; border-left: thick $accent; }
    PlanView.-shown { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.plan: dict[str, Any] | None = None
        self.stage = ""

    def observe(self, event: Event) -> None:
        if not isinstance(event, PlanUpdated):
            return
        self.plan, self.stage = event.plan, event.stage
        tracked = event.stage != "proposed"
        self.set_class(tracked, "-shown")
        if tracked:
            self.update(plan_lines(event.plan))

    @property
    def text(self) -> str:
        """What the view shows, as plain text (empty when hidden)."""
        return plan_lines(self.plan).plain if self.plan and self.stage != "proposed" else ""
