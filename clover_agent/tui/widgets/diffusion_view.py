"""The live block-diffusion view: the block the engine is denoising, slot by slot.

Each pass over the current block decides some of its undecided slots. Undecided slots are drawn as
shaded cells, the slots this pass decided are highlighted, the ones decided before are plain. When
the block is committed its text flows into the transcript and the view waits for the next block.
Only the engine backend streams blocks; with other backends the view stays hidden.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.widgets import Static

from clover_agent.events import ProvisionalBlock
from clover_agent.tui.text import printable

UNDECIDED = "░"


def slot_text(text: str) -> str:
    """A token's text as one visible run (line breaks and tabs shown, nothing empty)."""
    return printable(text.replace("\n", "⏎").replace("\t", "→")) or "·"


class DiffusionView(Static):
    """Shows the latest :class:`ProvisionalBlock`. ``token_text`` turns a token id into its text
    (the backend's tokenizer); without it, the decided text is shown after the slot map."""

    DEFAULT_CSS = """
    DiffusionView { padding: 0 1; margin: 0 0 0 2; color: $text; border-left: wide $secondary; }
    DiffusionView.-idle { display: none; }
    """

    def __init__(self, token_text: Callable[[int], str] | None = None) -> None:
        super().__init__("", classes="-idle")
        self.token_text = token_text
        self.block: ProvisionalBlock | None = None
        self.passes_shown = 0  # states drawn
        self.committed = 0  # blocks whose text went into the transcript

    def show_block(self, block: ProvisionalBlock) -> None:
        self.block = block
        self.passes_shown += 1
        self.remove_class("-idle")
        self.update(self.render_block(block))

    def commit(self) -> None:
        """The block's text is committed (it arrives as streamed text): hide the view."""
        if self.block is not None:
            self.committed += 1
            self.block = None
            self.add_class("-idle")
            self.update("")

    def render_block(self, block: ProvisionalBlock) -> Text:
        decided = sum(block.filled)
        out = Text(
            f"block {block.block} · pass {block.denoise_step} · {decided}/{len(block.filled)} decided"
            f" (+{len(block.newly_filled)})\n",
            style="dim",
        )
        newly = set(block.newly_filled)
        for slot, (token, filled) in enumerate(zip(block.token_ids, block.filled, strict=True)):
            if not filled:
                out.append(UNDECIDED, style="dim")
            elif self.token_text is None:
                out.append("█" if slot in newly else "▓", style="bold" if slot in newly else "")
            else:
                piece = slot_text(self.token_text(token))
                out.append(piece, style="bold reverse" if slot in newly else "")
        if self.token_text is None and block.text:
            out.append("\n" + block.text)
        return out
