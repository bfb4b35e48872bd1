"""The first screen of a new session (its transcript still empty): what the app is, that its
changes stay in the sandbox until ``/apply``, and three things to try."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

TRY = (
    ("make the failing test pass", "in your own words; @ names a file"),
    ("/tests", "run the tests in the sandbox"),
    ("/diff, then /apply", "review the changes, apply what you accept"),
)


def welcome() -> Group:
    about = Text.assemble(("clover-agent", "bold"), ": a coding agent working on a copy of your repository.")
    sandbox = Text.assemble(
        "Its changes stay in the sandbox until you ",
        ("/apply", "bold"),
        " them (",
        ("/diff", "bold"),
        " shows them).",
    )
    tries = Table.grid(padding=(0, 2))
    tries.add_column(style="bold", no_wrap=True)
    tries.add_column(style="dim", overflow="ellipsis", no_wrap=True)
    for index, (what, why) in enumerate(TRY, 1):
        tries.add_row(f"{index}. {what}", why)
    return Group(about, sandbox, Text(), Text("Three things to try:"), tries)


class Welcome(Static):
    DEFAULT_CSS = """
    Welcome { border: round $primary 50%; padding: 0 1; margin: 1 0 0 0; height: auto; }
    """

    def __init__(self) -> None:
        super().__init__(welcome(), id="welcome")
