"""Which tool calls may run: allow / ask / deny rules over tools, paths and commands.

A rule matches a call (a :class:`CallView`: what the tool says about the call) by glob patterns
over its action, its ``path`` and its command line; among the rules that match, the strictest wins
(deny over ask over allow), and a call no rule matches gets the policy's ``default``. ``ask`` is
settled by a person through :class:`~clover_agent.agent.approvals.Approvals`; where no one can be
asked it resolves to deny. The patterns are in docs/architecture.md ("The agent loop").
"""

from __future__ import annotations

import enum
import fnmatch
import posixpath
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from clover_agent.errors import UsageError
from clover_agent.tools.base import Tool
from clover_agent.tools.mcp import McpServerConfig, tool_name


class Decision(enum.IntEnum):
    """Ordered by strictness: the strictest matching rule wins."""

    ALLOW = 0
    ASK = 1
    DENY = 2


@dataclass(frozen=True)
class CallView:
    """One call as the policy sees it, from what its tool declares."""

    name: str
    arguments: dict[str, Any]
    action: str  # what ``tool`` patterns match: "editor:create", or the tool's name
    command: str | None = None  # the command line the call runs, if any
    mutates: bool = False  # whether the call may change the workspace

    @classmethod
    def of(cls, tool: Tool, arguments: dict[str, Any]) -> CallView:
        return cls(
            tool.name,
            arguments,
            tool.action(arguments),
            tool.command_line(arguments),
            tool.mutates(arguments),
        )


def _path_matches(path: str, pattern: str) -> bool:
    """Glob match on the normalised path; a leading ``!`` negates. Relative paths count as in /workspace."""
    negate = pattern.startswith("!")
    pattern = pattern.removeprefix("!")
    normal = posixpath.normpath(posixpath.join("/workspace", path))
    # "/workspace/*" should also cover "/workspace" itself, hence the second form with a slash.
    hit = fnmatch.fnmatchcase(normal, pattern) or fnmatch.fnmatchcase(normal + "/", pattern)
    return hit != negate


@dataclass(frozen=True)
class Rule:
    decision: Decision
    tool: str = "*"
    path: str | None = None
    command: str | None = None

    def matches(self, call: CallView) -> bool:
        if not (fnmatch.fnmatchcase(call.action, self.tool) or fnmatch.fnmatchcase(call.name, self.tool)):
            return False
        if self.path is not None:
            path = call.arguments.get("path")
            if not isinstance(path, str) or not _path_matches(path, self.path):
                return False
        command = call.command
        return self.command is None or (
            command is not None and fnmatch.fnmatchcase(command.strip(), self.command)
        )

    def describe(self) -> str:
        parts = [f"tool={self.tool}"]
        if self.path is not None:
            parts.append(f"path={self.path}")
        if self.command is not None:
            parts.append(f"command={self.command}")
        return f"{self.decision.name.lower()} {' '.join(parts)}"


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str
    #: What an ``always`` answer is remembered by: the rule that decided (None: the default), the
    #: call's action and its exact command line, if it runs one ("always" for ``pip install x``
    #: covers that command, not every install).
    key: Hashable = None


def always_scope(verdict: Verdict, call: CallView, policy: str) -> str:
    """What answering ``always`` to ``call`` allows from then on, in words: every later call with
    the same key (:attr:`Verdict.key`: the deciding rule, the action, the exact command line)."""
    rule, action, command = verdict.key if isinstance(verdict.key, tuple) else (None, call.action, None)
    if command is not None:
        what = f"`{call.name}` running exactly `{command}` again"
    else:
        what = f"every `{action}` call"
        if isinstance(rule, Rule) and rule.path is not None:
            what += f" on a path matching `{rule.path}`"
        elif "path" in call.arguments:
            what += " (any file, not only this one)"
    return f"{what}, without asking, for the rest of this session under the {policy!r} policy"


@dataclass(frozen=True)
class Policy:
    name: str
    rules: tuple[Rule, ...] = ()
    default: Decision = Decision.ALLOW

    def check(self, call: CallView) -> Verdict:
        matching = [rule for rule in self.rules if rule.matches(call)]
        if not matching:
            reason = f"no rule of policy {self.name!r} matches; default"
            return Verdict(self.default, reason, (None, call.action, call.command))
        strictest = max(matching, key=lambda rule: rule.decision)
        reason = f"policy {self.name!r}: {strictest.describe()}"
        return Verdict(strictest.decision, reason, (strictest, call.action, call.command))


#: Paths outside the workspace are refused (the tools refuse them too; this says why, earlier).
_DENY_OUTSIDE = (Rule(Decision.DENY, tool="*", path="!/workspace/*"),)
#: Shell commands a person should see first in an interactive session (they reach outside).
_ASK_COMMANDS = ("*git push*", "*curl *", "*wget *", "*pip install*", "*npm install*", "*sudo *")

PRESETS: dict[str, Policy] = {
    "read-only": Policy(
        "read-only",
        (
            Rule(Decision.ALLOW, tool="editor:view"),
            Rule(Decision.ALLOW, tool="search"),
            Rule(Decision.ALLOW, tool="run_tests"),
            Rule(Decision.ALLOW, tool="finish"),
            Rule(Decision.DENY, tool="editor:create"),
            Rule(Decision.DENY, tool="editor:str_replace"),
            Rule(Decision.DENY, tool="editor:insert"),
            Rule(Decision.DENY, tool="editor:undo_edit"),
            Rule(Decision.DENY, tool="shell"),
            *_DENY_OUTSIDE,
        ),
        default=Decision.DENY,
    ),
    "workspace": Policy(
        "workspace",
        (*_DENY_OUTSIDE, *(Rule(Decision.ASK, tool="shell", command=c) for c in _ASK_COMMANDS)),
        default=Decision.ALLOW,
    ),
    # A bot never waits for a person: what `workspace` would ask about is denied outright.
    "ci": Policy(
        "ci",
        (*_DENY_OUTSIDE, *(Rule(Decision.DENY, tool="shell", command=c) for c in _ASK_COMMANDS)),
        default=Decision.ALLOW,
    ),
}
DEFAULT_PRESET = "workspace"

#: The interactive front ends' preset beside the core's (the TUI's and ACP's ``ask``): ask before
#: every call that may change the workspace. Not a preset of ``fix`` or the CI bot.
ASK_POLICY = Policy(
    "ask",
    (
        *_DENY_OUTSIDE,
        *(Rule(Decision.ASK, tool=f"editor:{c}") for c in ("create", "str_replace", "insert", "undo_edit")),
        Rule(Decision.ASK, tool="shell"),
    ),
    default=Decision.ALLOW,
)


def preset(name: str) -> Policy:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown policy {name!r}; choose one of: {', '.join(PRESETS)}") from None


def with_mcp(policy: Policy, servers: Sequence[McpServerConfig]) -> Policy:
    """``policy`` with one rule per MCP server: its tools asked about, or allowed where the server's
    settings say ``approve = "allow"`` (a stricter rule of the policy still wins). A policy that
    denies by default (read-only) gets none: their tools stay denied."""
    if policy.default is Decision.DENY or not servers:
        return policy
    rules = tuple(
        Rule(Decision.ALLOW if s.approve == "allow" else Decision.ASK, tool=tool_name(s.name, "") + "*")
        for s in servers
    )
    return Policy(policy.name, (*policy.rules, *rules), policy.default)
