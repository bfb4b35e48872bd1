"""The agent's reply in the transcript, streamed as Markdown while the model writes it.

The raw stream holds the tool calls too (``<tool_call>`` …); they get cards of their own, so the
text is shown up to the first call, holding back the end of the stream while it may be the start
of that tag. When the turn is complete its parsed content replaces the streamed text.
"""

from __future__ import annotations

from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

TOOL_CALL_TAG = "<tool_call>"


def visible_prefix(text: str) -> str:
    """``text`` up to its first tool call, less a tail that may be the tag's beginning."""
    cut = text.find(TOOL_CALL_TAG)
    if cut >= 0:
        return text[:cut]
    for keep in range(min(len(TOOL_CALL_TAG) - 1, len(text)), 0, -1):
        if TOOL_CALL_TAG.startswith(text[-keep:]):
            return text[:-keep]
    return text


class AgentText(Markdown):
    """The visible text of one model turn."""

    DEFAULT_CSS = """
    AgentText { margin: 0; padding: 0 1; background: transparent; }
    """

    def __init__(self) -> None:
        super().__init__("")
        self.raw = ""  # everything streamed so far
        self.shown = ""  # the part of it on screen
        self._stream: MarkdownStream | None = None

    async def feed(self, text: str) -> None:
        self.raw += text
        visible = visible_prefix(self.raw).lstrip("\n")
        if len(visible) > len(self.shown) and visible.startswith(self.shown):
            if self._stream is None:
                self._stream = Markdown.get_stream(self)
            await self._stream.write(visible[len(self.shown) :])
            self.shown = visible

    async def finish(self, content: str) -> None:
        """The turn is complete: show its parsed ``content`` (the tool calls taken out)."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        content = content.strip()
        if content != self.shown.strip():
            await self.update(content)
        self.shown = content
        self.display = bool(content)
