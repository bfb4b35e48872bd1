"""``/apply``: the session's changes file by file; accept or reject each, then apply the accepted."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static
from textual.widgets.selection_list import Selection

from clover_agent.tui.handback import FileChange
from clover_agent.tui.text import printable
from clover_agent.tui.widgets.diff_view import DiffView


class ApplyScreen(ModalScreen[list[FileChange] | None]):
    """Dismissed with the accepted files (Enter), or None (Esc: nothing is applied)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "apply", "Apply accepted", priority=True),
        Binding("escape", "dismiss(None)", "Cancel"),
    ]
    DEFAULT_CSS = """
    ApplyScreen { align: center middle; }
    ApplyScreen > Vertical { width: 95%; height: 95%; border: round $accent; background: $surface; }
    ApplyScreen .title { text-style: bold; padding: 0 1; }
    ApplyScreen #apply-count { color: $text-muted; padding: 0 1; }
    ApplyScreen SelectionList { height: auto; max-height: 8; }
    ApplyScreen VerticalScroll { height: 1fr; }
    """

    def __init__(self, changes: list[FileChange]) -> None:
        super().__init__()
        self.changes = changes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "Apply to your working tree · space: accept/reject · enter: apply · esc: cancel",
                classes="title",
            )
            yield SelectionList[int](
                *(Selection(self._label(c), index, True) for index, c in enumerate(self.changes)), id="files"
            )
            yield Static(self._count(len(self.changes)), id="apply-count")
            with VerticalScroll():
                yield DiffView(self.changes[0].patch if self.changes else "", id="file-diff")

    def _count(self, accepted: int) -> str:
        rejected = len(self.changes) - accepted
        return f"{accepted} accepted, {rejected} rejected (the highlighted file's change below)"

    def on_selection_list_selected_changed(self, event: SelectionList.SelectedChanged) -> None:
        self.query_one("#apply-count", Static).update(self._count(len(event.selection_list.selected)))

    @staticmethod
    def _label(change: FileChange) -> Text:
        again = ", changed since applied" if change.applied_before else ""
        return Text(
            f"{printable(change.path, single_line=True)}  ({change.status}, +{change.added} -{change.removed}{again})"
        )

    def on_selection_list_selection_highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        index = event.selection.value
        self.query_one("#file-diff", DiffView).set_diff(self.changes[index].patch)

    @property
    def accepted(self) -> list[FileChange]:
        return [self.changes[i] for i in self.query_one("#files", SelectionList).selected]

    def action_apply(self) -> None:
        self.dismiss(self.accepted)
