"""The app's slash commands in Textual's command palette (ctrl+p): the same table as ``/help`` and
the ``/`` menu, each with what it does; choosing one runs it (one that needs an argument, such as
``/sandbox WHAT``, is put in the prompt for the person to finish)."""

from __future__ import annotations

from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

from clover_agent.tui.keys import COMMANDS, Command
from clover_agent.tui.widgets.prompt import PromptBox


class CommandHost(Protocol):
    """What the palette needs of the app (which imports the palette, never the other way)."""

    @property
    def prompt(self) -> PromptBox: ...

    async def run_command(self, name: str, argument: str) -> None: ...


class SlashCommands(Provider):
    """See the module docstring."""

    async def _run(self, command: Command) -> None:
        app = cast(CommandHost, self.app)
        if command.needs_argument:
            app.prompt.load_text(f"/{command.name} ")
            app.prompt.move_cursor(app.prompt.document.end)
            app.prompt.focus()
            return
        await app.run_command(command.name, "")

    async def discover(self) -> Hits:
        for command in COMMANDS:
            yield DiscoveryHit(  # Content, not markup: "[N]" stays
                Content(command.usage),
                partial(self._run, command),
                text=command.usage,
                help=command.description,
            )

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in COMMANDS:
            name = f"/{command.name}"
            score = matcher.match(name)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(name) + Content(command.usage[len(name) :]),
                    partial(self._run, command),
                    text=command.usage,
                    help=command.description,
                )
