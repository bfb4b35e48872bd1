"""The policies the TUI offers: the core's presets and ``ask`` (ask before every call that may change
the workspace), and what every TUI session tells the model about working with a person."""

from __future__ import annotations

from clover_agent.agent.policy import ASK_POLICY, PRESETS, Policy
from clover_agent.errors import UsageError

#: Said to the model in every TUI session, after the repository's system prompt.
INTERACTIVE_NOTE = """

# Working with the user
You are pair-programming with a person in a terminal. Each of their messages is a request; work on
it with your tools. When you changed files and the work is done, call `finish` with a summary for
them; to answer a question, or when you need their answer to go on, reply in plain text with no
tool call (that ends your turn). They may interrupt you and correct course: follow their latest
message."""


#: Policies the TUI offers: the core's presets and its own ``ask``.
POLICIES: dict[str, Policy] = {**PRESETS, ASK_POLICY.name: ASK_POLICY}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise UsageError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None
