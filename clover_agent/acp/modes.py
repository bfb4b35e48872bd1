"""The session modes an editor offers (``session/set_mode``): one entry per mode, each a policy.

A mode is what the agent may do without asking: ``ask`` asks before every edit and command,
``auto`` edits and runs commands in the sandbox unasked (the ``workspace`` policy), ``plan`` only
looks until the person approves a plan (:mod:`clover_agent.agent.plan`). To add one,
add an entry to :data:`MODES`. The starting mode follows ``--policy``; a policy no mode names
(``read-only``, ``ci``) is offered as a mode of its own, so the editor shows what is in force.
"""

from __future__ import annotations

from dataclasses import dataclass

from acp import schema

from clover_agent.agent.plan import PLAN_POLICY
from clover_agent.agent.policy import ASK_POLICY, PRESETS, Policy

#: The mode that plans: read-only until the person approves a plan.
PLAN = "plan"


@dataclass(frozen=True)
class Mode:
    """One mode: its id (what ``session/set_mode`` names), what the editor shows, and its policy."""

    id: str
    name: str
    description: str
    policy: Policy

    def schema(self) -> schema.SessionMode:
        return schema.SessionMode(id=self.id, name=self.name, description=self.description)


MODES: tuple[Mode, ...] = (
    Mode("ask", "Ask", "Ask before every edit and every command in the sandbox.", ASK_POLICY),
    Mode(
        "auto",
        "Auto",
        "Edit and run commands in the sandbox without asking (commands that reach outside are asked).",
        PRESETS["workspace"],
    ),
    Mode(
        PLAN,
        "Plan",
        "Look first: read, search and run tests, change nothing, and propose a plan; once you approve "
        "it, the agent carries it out in the mode you choose.",
        PLAN_POLICY,
    ),
)


def modes_for(policy: Policy) -> tuple[tuple[Mode, ...], Mode]:
    """The modes a session offers and the one it starts in, for the policy it was started with."""
    for mode in MODES:
        if mode.policy.name == policy.name:
            return MODES, mode
    own = Mode(policy.name, policy.name, f"The {policy.name!r} policy this agent was started with.", policy)
    return (*MODES, own), own
