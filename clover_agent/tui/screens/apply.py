"""``/apply``: the session's changes file by file, with their verdict; accept or reject each, then
apply the accepted (a part is judged again on its own and offered again before it is applied)."""

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
    ApplyScreen #apply-verdict { padding: 0 1; }
    ApplyScreen SelectionList { height: auto; max-height: 8; }
    ApplyScreen VerticalScroll { height: 1fr; }
    """

    def __init__(self, changes: list[FileChange], verdict: str = "", review: list[str] | None = None) -> None:
        super().__init__()
        self.changes = changes
        self.verdict = verdict  # "<verdict>: <message>", as `fix` says it, of exactly these files
        self.review = review or []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "Apply to your working tree · space: accept/reject · enter: apply · esc: cancel",
                classes="title",
            )
            if self.verdict:
                yield Static(self._verdict(), id="apply-verdict")
            yield SelectionList[int](
                *(Selection(self._label(c), index, True) for index, c in enumerate(self.changes)), id="files"
            )
            yield Static(self._count(len(self.changes)), id="apply-count")
            with VerticalScroll():
                yield DiffView(self.changes[0].patch if self.changes else "", id="file-diff")

    def _verdict(self) -> Text:
        word = self.verdict.split(":", 1)[0]
        style = (
            "bold green"
            if word.startswith("fixed")
            else "bold yellow"
            if word == "needs review"
            else "bold red"
        )
        text = Text("Verdict: ", style="bold")
        text.append(printable(self.verdict, single_line=True), style=style)
        for item in self.review[:10]:
            text.append("\n  - " + printable(item, single_line=True))
        if len(self.review) > 10:
            text.append(f"\n  - and {len(self.review) - 10} more")
        return text

    def _count(self, accepted: int) -> str:
        rejected = len(self.changes) - accepted
        part = " (a part is checked again on its own before it is applied)" if rejected else ""
        return f"{accepted} accepted, {rejected} rejected{part} (the highlighted file's change below)"

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
