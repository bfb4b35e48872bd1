"""The slash commands an editor lists (``available_commands_update``) and what each does.

A prompt that starts with ``/NAME`` where NAME is one of :data:`COMMANDS` runs the command instead
of going to the model; its answer is a message. Any other prompt, ``/x`` of an unknown ``x``
included, goes to the model as text (a path such as ``/tmp`` starts with a slash too).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from acp import schema

from clover_agent.acp.updates import tests_table
from clover_agent.agent.loop import Agent
from clover_agent.errors import CloverError
from clover_agent.events import EventBus, TestsRun
from clover_agent.handback.session import SessionHandBack, sections
from clover_agent.safe_text import terminal_safe
from clover_agent.sandboxes.base import Sandbox
from clover_agent.session.assembly import SessionConfig
from clover_agent.session.events import TurnsUndone
from clover_agent.tools.mcp import McpServers
from clover_agent.tools.run_tests import run_tests_in


class CommandSession(Protocol):
    """What the commands use of a session (:class:`~clover_agent.acp.session.AcpSession`)."""

    config: SessionConfig
    bus: EventBus
    sandbox: Sandbox | None
    mcp: McpServers | None
    requests: list[tuple[int, int]]  # (turn, first step) of the requests not undone
    usage_last: tuple[int, int, int]  # model calls, tokens in, tokens out
    usage_total: tuple[int, int, int]

    def ready(self) -> tuple[Agent, SessionHandBack]: ...

    async def offer_handback(self, *, always_ask: bool = False) -> bool: ...


@dataclass(frozen=True)
class Command:
    name: str
    description: str
    hint: str | None  # what its argument is, when it takes one
    run: Callable[[CommandSession, str], Awaitable[str]]

    def schema(self) -> schema.AvailableCommand:
        given = None if self.hint is None else schema.UnstructuredCommandInput(hint=self.hint)
        return schema.AvailableCommand(
            name=self.name,
            description=self.description,
            input=None if given is None else schema.AvailableCommandInput(root=given),
        )


def parse(text: str) -> tuple[Command, str] | None:
    """The command a prompt runs, and its argument; None for a request to the model."""
    match = re.fullmatch(r"\s*/([A-Za-z][\w-]*)(?:\s+(.*))?", text, re.DOTALL)
    if match is None:
        return None
    command = BY_NAME.get(match.group(1).lower())
    return None if command is None else (command, (match.group(2) or "").strip())


def fenced(text: str, language: str = "") -> str:
    """``text`` as a Markdown code block it cannot close early (a fence longer than its backticks)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


async def undo(session: CommandSession, argument: str) -> str:
    """Put the sandbox's workspace back as it was before the last request that changed it."""
    agent, handback = session.ready()
    if agent.steering.busy:
        raise CloverError("the agent is working; cancel it before undoing")
    checkpoints = agent.checkpoints
    turns = [t for t in reversed(session.requests) if checkpoints and checkpoints.can_undo_to(t[1])]
    if not turns:
        return "Nothing to undo: no request changed the workspace since the session started."
    turn, first_step = turns[0]
    before = await handback.diff()
    if await agent.undo(first_step) is None:
        return "Nothing to undo: the workspace is as it was before the last request."
    after = sections(await handback.diff())
    old = sections(before)
    files = sorted(path for path in old.keys() | after.keys() if old.get(path) != after.get(path))
    session.requests = [t for t in session.requests if t[0] < turn]
    session.bus.emit(TurnsUndone(turn=turn, files=files))
    listed = ", ".join(f"`{_inert(f)}`" for f in files) or "no file your tree would get"
    return f"Undid request {turn} in the sandbox: {listed}. Your files were not touched."


async def tests(session: CommandSession, argument: str) -> str:
    """Run the tests (or ``argument``'s target) in the sandbox now."""
    session.ready()
    assert session.sandbox is not None
    report = await run_tests_in(session.sandbox, argument or None)
    session.bus.emit(TestsRun(phase="user", target=argument, report=report.to_dict()))
    return tests_table(report.to_dict())


async def diff(session: CommandSession, argument: str) -> str:
    """The session's changes your tree does not hold yet."""
    _, handback = session.ready()
    patch = await handback.diff()
    return (
        fenced(patch, "diff") if patch.strip() else "No changes: your tree holds all of the session's work."
    )


async def apply(session: CommandSession, argument: str) -> str:
    """Offer the session's changes now (the hand-back's permission request)."""
    agent, _ = session.ready()
    if agent.steering.busy:
        raise CloverError("the agent is working; cancel it before /apply")
    offered = await session.offer_handback(always_ask=True)
    return "" if offered else "Nothing to apply: your tree holds all of the session's work."


async def usage(session: CommandSession, argument: str) -> str:
    """Tokens in and out and model calls: of the last request and of the session."""
    last, total = session.usage_last, session.usage_total
    return "\n".join(
        [
            "| | model calls | tokens in | tokens out |",
            "|---|---|---|---|",
            f"| last request | {last[0]} | {last[1]} | {last[2]} |",
            f"| this session | {total[0]} | {total[1]} | {total[2]} |",
        ]
    )


async def mcp(session: CommandSession, argument: str) -> str:
    """The MCP servers: running or why not, and their tools."""
    if not session.config.mcp_servers or session.mcp is None:
        return "No MCP servers: add [mcp_servers.NAME] to your settings (docs/mcp.md), or pass them from the editor."
    lines = []
    for state in session.mcp.states.values():
        name, where = _inert(state.name), _inert(state.where)
        if state.state == "failed":
            lines.append(f"- `{name}` ({where}): failed: {_inert(state.error)}")
        else:
            tools = ", ".join(f"`{_inert(t)}`" for t in state.tools) or "no tools"
            lines.append(f"- `{name}` ({where}): {state.now}; {len(state.tools)} tool(s): {tools}")
    return "MCP servers:\n" + "\n".join(lines)


def _inert(text: str) -> str:
    """A server's words on one line, its control characters visible and no backtick to end a code span."""
    return terminal_safe(text, single_line=True, workflow_commands=False).replace("`", "'")


COMMANDS: tuple[Command, ...] = (
    Command(
        "undo", "Undo the last request's changes in the sandbox (your files are not touched)", None, undo
    ),
    Command("tests", "Run the tests in the sandbox now and show the table", "target (optional)", tests),
    Command("diff", "Show the session's changes your files do not hold yet", None, diff),
    Command("apply", "Offer the session's changes for your files now", None, apply),
    Command("usage", "Model calls and tokens: of the last request and of the session", None, usage),
    Command("mcp", "List the MCP servers: running or why not, and their tools", None, mcp),
)
BY_NAME = {command.name: command for command in COMMANDS}
