"""Hooks: the user's own commands, run on the agent's events, able to deny or change a tool call,
send the agent back to work or veto the hand-back (docs/hooks.md).

:mod:`.config` reads the ``[[hooks.EVENT]]`` tables, :mod:`.process` runs one command with a
timeout, :mod:`.outcome` says how a run counts, :mod:`.tool_input` shows a call as Claude Code
names it, :mod:`.runner` (:class:`Hooks`) runs the hooks of an event and says what they decided.
"""

from clover_agent.hooks.config import EVENTS, HookConfig, parse_hooks
from clover_agent.hooks.outcome import hook_line
from clover_agent.hooks.runner import Hooks, PromptVerdict, StopVerdict, ToolVerdict

__all__ = [
    "EVENTS",
    "HookConfig",
    "Hooks",
    "PromptVerdict",
    "StopVerdict",
    "ToolVerdict",
    "hook_line",
    "parse_hooks",
]
