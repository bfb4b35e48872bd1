"""Which tool calls may run: allow / ask / deny rules over tools, paths and shell commands.

A rule matches a call by glob patterns: ``tool`` against the call's action (``editor:view``,
``editor:create``, … for the editor, the bare tool name for the others — a bare ``editor`` matches
every editor command), ``path`` against the call's normalised ``path`` argument (``!`` in front
negates: ``!/workspace/*`` is "outside the workspace") and ``command`` against a shell command. Among the rules that match, the strictest wins: deny over ask over allow. A call no
rule matches gets the policy's ``default``.

``ask`` is settled by an approval callback (a person at a terminal). Where there is no terminal,
``ask`` resolves to deny, and the loop records that decision as an event.
"""

from __future__ import annotations

import enum
import fnmatch
import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clover_agent.errors import UsageError


class Decision(enum.IntEnum):
    """Ordered by strictness: the strictest matching rule wins."""

    ALLOW = 0
    ASK = 1
    DENY = 2


#: Editor commands that change files (everything but ``view``).
MUTATING_EDITOR_COMMANDS = frozenset({"create", "str_replace", "insert", "undo_edit"})


def call_action(name: str, arguments: dict[str, Any]) -> str:
    """The string ``tool`` patterns match: ``editor:<command>`` for the editor, else the name."""
    command = arguments.get("command")
    if name == "editor" and isinstance(command, str):
        return f"editor:{command}"
    return name


def is_mutating(name: str, arguments: dict[str, Any]) -> bool:
    """Whether a call may change the workspace (and so gets a checkpoint before it runs)."""
    if name == "shell":
        return True
    return name == "editor" and arguments.get("command") in MUTATING_EDITOR_COMMANDS


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

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        action = call_action(name, arguments)
        if not (fnmatch.fnmatchcase(action, self.tool) or fnmatch.fnmatchcase(name, self.tool)):
            return False
        if self.path is not None:
            path = arguments.get("path")
            if not isinstance(path, str) or not _path_matches(path, self.path):
                return False
        if self.command is not None:
            command = arguments.get("command") if name == "shell" else None
            if not isinstance(command, str) or not fnmatch.fnmatchcase(command.strip(), self.command):
                return False
        return True

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


@dataclass(frozen=True)
class Policy:
    name: str
    rules: tuple[Rule, ...] = ()
    default: Decision = Decision.ALLOW

    def check(self, name: str, arguments: dict[str, Any]) -> Verdict:
        matching = [rule for rule in self.rules if rule.matches(name, arguments)]
        if not matching:
            return Verdict(self.default, f"no rule of policy {self.name!r} matches; default")
        strictest = max(matching, key=lambda rule: rule.decision)
        return Verdict(strictest.decision, f"policy {self.name!r}: {strictest.describe()}")


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


def preset(name: str) -> Policy:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown policy {name!r}; choose one of: {', '.join(PRESETS)}") from None


#: Settles an ``ask``: gets (tool name, arguments, reason), returns True to allow.
Approver = Callable[[str, dict[str, Any], str], Awaitable[bool]]


@dataclass
class ApprovalOutcome:
    approved: bool
    decided_by: str  # "policy" | "user" | "no-terminal"
    reason: str
    asked: bool = False


async def decide(
    policy: Policy, name: str, arguments: dict[str, Any], approver: Approver | None
) -> ApprovalOutcome:
    """Apply the policy to one call; ``approver`` None means no terminal (ask resolves to deny)."""
    verdict = policy.check(name, arguments)
    if verdict.decision is Decision.ALLOW:
        return ApprovalOutcome(True, "policy", verdict.reason)
    if verdict.decision is Decision.DENY:
        return ApprovalOutcome(False, "policy", verdict.reason)
    if approver is None:
        return ApprovalOutcome(
            False, "no-terminal", f"{verdict.reason} (asked, no terminal: denied)", asked=True
        )
    approved = await approver(name, arguments, verdict.reason)
    return ApprovalOutcome(approved, "user", verdict.reason, asked=True)
