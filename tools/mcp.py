"""Tools from MCP servers: each tool a server lists becomes a :class:`Tool` named
``mcp__<server>__<tool>``, run through the same policy, approvals, trimming and trajectory as ours.

A stdio server runs inside the sandbox by default (:meth:`Sandbox.attached`), so what it does stays
in the workspace copy, without network where the sandbox has none; ``where = "host"`` runs it on
this machine, the user's explicit choice. A URL is a Streamable HTTP server, reached from this
machine. A server that does not start is reported once and offers no tools; one that dies during a
call ends that call with an error and its tools are withdrawn (:data:`TOOLS_GONE`). docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from clover_agent.sandboxes.base import Sandbox, SandboxError
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult, head_tail
from clover_agent.tools.registry import TOOLS_GONE

#: What every MCP tool's name starts with (a policy rule ``mcp__*`` matches them all).
PREFIX = "mcp__"
#: Seconds a server may take to start and list its tools, and one call to answer.
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 300.0
#: OpenAI-style function names: letters, digits, ``_`` and ``-``, at most 64 characters.
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")
#: Where a stdio server may run, and how its calls are approved (``ask``: through the policy's
#: approvals; ``allow``: run without asking, unless the policy denies them).
WHERE = ("sandbox", "host")
APPROVE = ("ask", "allow")
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


class _SdkLog(logging.Handler):
    """The MCP SDK's log records (a server printing what is not MCP, a stream failing): kept for
    the messages that name why a server failed, never printed over a front end's screen."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []  # the last 20
        self.count = 0  # every line ever kept: where a server's start began reading

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        found = _bad_input(error) if error is not None else None
        if found is not None:
            text = f"it wrote what is not MCP on its stdout: {found[:200]!r}"
        elif error is not None:
            text += f" ({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''})"
        self.lines = [*self.lines[-19:], text]
        self.count += 1

    def since(self, count: int) -> list[str]:
        """The lines kept after the ``count``-th (those still held)."""
        return self.lines[len(self.lines) - min(self.count - count, len(self.lines)) :]


def _bad_input(error: BaseException) -> str | None:
    """The line a server wrote that is not a JSON-RPC message (from the SDK's validation error)."""
    errors = getattr(error, "errors", None)
    try:
        found = errors()[0].get("input") if callable(errors) else None
    except (IndexError, TypeError, AttributeError):
        return None
    return found if isinstance(found, str) else None


_SDK_LOG = _SdkLog()
_sdk_logger = logging.getLogger("mcp")
_sdk_logger.addHandler(_SDK_LOG)
_sdk_logger.propagate = False  # its tracebacks would land on the TUI's screen


@dataclass
class ServerState:
    """What ``/mcp`` shows of one server: running, failed (and why) or stopped, and its tools."""

    name: str
    where: str  # McpServerConfig.describe()
    state: str = "starting"  # starting | running | failed | stopped
    tools: list[str] = field(default_factory=list)
    error: str = ""
    connection: _Connection | None = None

    @property
    def now(self) -> str:
        """The state as it is now: a running server whose connection broke during a call has stopped."""
        if self.state == "running" and self.connection is not None and not self.connection.alive:
            return "stopped (it died during a call; its tools are withdrawn)"
        return self.state


_KEYS = ("command", "args", "env", "url", "headers", "where", "approve")


@dataclass(frozen=True)
class McpServerConfig:
    """One server: ``command`` (with ``args`` and ``env``) over stdio, or ``url``; ``where`` a
    stdio server runs ("sandbox" or "host"); ``origin`` says who named it (shown in messages)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    where: str = "sandbox"
    approve: str = "ask"
    origin: str = "settings"
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with every HTTP request

    def describe(self) -> str:
        if self.url:
            return f"{self.url} (HTTP)"
        return " ".join([self.command or "", *self.args]) + f" (stdio, in the {self.where})"


def parse_servers(tables: Mapping[str, Any], *, origin: str) -> list[McpServerConfig]:
    """The servers of ``[mcp_servers.NAME]`` tables (or an ACP client's list, made into such
    tables). Raises :class:`ValueError` naming the server and the key that is wrong."""
    servers = []
    for name, table in tables.items():
        where = f"[mcp_servers.{name}]"
        if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
            raise ValueError(f"{where}: a server's name is 1 to 32 letters, digits, _ or -")
        if not isinstance(table, Mapping):
            raise ValueError(f"{where} must be a table")
        unknown = sorted(set(table) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
        command, url = table.get("command"), table.get("url")
        if (command is None) == (url is None):
            raise ValueError(f"{where}: give either command (a stdio server) or url (an HTTP server)")
        for key, value in (("command", command), ("url", url)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{where}: {key} must be a non-empty string")
        args, env, headers = table.get("args", []), table.get("env", {}), table.get("headers", {})
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"{where}: args must be a list of strings")
        for key, value in (("env", env), ("headers", headers)):
            if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
                raise ValueError(f"{where}: {key} must be a table of strings")
        if headers and url is None:
            raise ValueError(f"{where}: headers are for an HTTP server (url)")
        place, approve = table.get("where", "sandbox"), table.get("approve", "ask")
        if place not in WHERE:
            raise ValueError(f"{where}: where must be one of {', '.join(map(repr, WHERE))}")
        if approve not in APPROVE:
            raise ValueError(f"{where}: approve must be one of {', '.join(map(repr, APPROVE))}")
        servers.append(McpServerConfig(name, command, tuple(args), dict(env), url, place, approve, origin))
    return servers


def tool_name(server: str, tool: str) -> str:
    """The name the model sees: ``mcp__<server>__<tool>``, other characters made ``_``, cut to 64."""
    return _NAME_OK.sub("_", f"{PREFIX}{server}__{tool}")[:64]


class McpTool(Tool):
    """One tool of one server. Instances are made by :meth:`McpServers.start` (one subclass per
    tool: name, description and schema are class-level in :class:`Tool`)."""

    server: _Connection
    remote: str  # the tool's name at the server

    def mutates(self, args: dict[str, Any]) -> bool:
        return True  # nothing says what a server's tool does: the agent snapshots first

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.server.call(self.remote, args)


class _Connection:
    """A started server: its client session, its tools' names, whether it still answers."""

    def __init__(self, config: McpServerConfig, client: Any) -> None:
        self.config = config
        self.client = client
        self.names: list[str] = []
        self.alive = True

    async def call(self, remote: str, args: dict[str, Any]) -> ToolResult:
        from mcp.shared.exceptions import MCPError

        name = self.config.name
        if not self.alive:
            raise ToolError(f"the MCP server `{name}` is no longer running")
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                result = await self.client.call_tool(remote, args)
        except TimeoutError:
            return ToolResult(False, f"The MCP server `{name}` did not answer within {CALL_TIMEOUT_S:.0f} s.")
        except (MCPError, OSError, EOFError) as exc:  # the connection is gone: so is the server
            self.alive = False
            return ToolResult(
                False,
                f"The MCP server `{name}` stopped ({exc}); its tools are withdrawn: {', '.join(self.names)}.",
                {TOOLS_GONE: list(self.names), "mcp_server": name},
            )
        parts = [_content_text(block) for block in result.content]
        text = "\n".join(p for p in parts if p) or "(no output)"
        data: dict[str, Any] = {"mcp_server": name, "mcp_tool": remote}
        if result.structured_content is not None:
            data["structured"] = result.structured_content
        return ToolResult(not result.is_error, head_tail(text), data)


def _content_text(block: Any) -> str:
    """A content block as the model reads it: text as it is, anything else named."""
    kind = getattr(block, "type", "?")
    if kind == "text":
        return str(block.text)
    if kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
        return str(block.resource.text)
    mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", None)
    return f"[{kind} content{f' ({mime})' if mime else ''} left out]"


class McpServers:
    """The servers of one agent run, started in one sandbox; use as ``async with``. ``tools`` are
    those of the servers that started; ``report`` is called once per server that did not start.
    ``log_dir``: where each stdio server's stderr goes (``mcp-<name>.log``), else nowhere."""

    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        sandbox: Sandbox,
        *,
        report: Callable[[str], None],
        log_dir: Path | None = None,
    ) -> None:
        self.configs = list(configs)
        self.sandbox = sandbox
        self.report = report
        self.log_dir = log_dir
        self.tools: list[Tool] = []
        self.states: dict[str, ServerState] = {
            c.name: ServerState(c.name, c.describe()) for c in self.configs
        }
        self._stack = contextlib.AsyncExitStack()
        self._held: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> McpServers:
        for config in self.configs:
            state = self.states[config.name]
            seen = _SDK_LOG.count
            try:
                async with asyncio.timeout(START_TIMEOUT_S):  # in this task: the client's scopes are
                    connection = await self._start(config)
            except Exception as exc:  # a server of the user's: any way it fails is named, once
                said = _SDK_LOG.since(seen)
                state.state, state.error = "failed", self._why_not(config, exc, said)
                self.report(f"MCP server `{config.name}` ({config.describe()}) did not start: {state.error}")
            else:
                state.state, state.tools, state.connection = "running", list(connection.names), connection
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()
        for state in self.states.values():
            if state.state == "running":
                state.state = "stopped"

    def _why_not(self, config: McpServerConfig, exc: BaseException, said: list[str]) -> str:
        """Why ``config``'s server did not start, in a line, and the way forward."""
        log = self._log_path(config)
        text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
        tail = [line.strip() for line in text.splitlines() if line.strip()]
        command = " ".join([config.command or "", *config.args])
        here = "on this machine" if config.where == "host" else "in the sandbox"
        if config.url:
            reason, forward = _why(exc), "check that the server answers at that URL"
        elif isinstance(exc, FileNotFoundError) or any(
            re.search(r"executable file not found|command not found|No such file", line)
            for line in [*tail[-1:], *said[-1:]]
        ):
            reason, forward = f"`{config.command}` is not installed {here}", self._install(config)
        elif said and said[-1].startswith("it wrote what is not MCP"):
            reason = said[-1]
            forward = f"a stdio server writes only MCP messages on its stdout (its logs go to stderr): check `{command}`"
        elif tail:
            reason, forward = f"it exited: {tail[-1][:200]}", self._install(config)
        else:
            reason, forward = _why(exc), f"check that `{command}` starts an MCP server over stdio {here}"
        where = f"; its output: {log}" if log is not None and tail else ""
        return f"{reason}. To fix: {forward}{where}"

    @staticmethod
    def _install(config: McpServerConfig) -> str:
        if config.where == "host":
            return f"install it on this machine, or fix [mcp_servers.{config.name}]'s command"
        return (
            "the sandbox has no network and only its image's programs: run it on this machine with "
            f'`where = "host"` in [mcp_servers.{config.name}], or add it to the sandbox image'
        )

    def _log_path(self, config: McpServerConfig) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"mcp-{_NAME_OK.sub('_', config.name)}.log"

    async def open_held(self) -> McpServers:
        """Start the servers in a task of their own, for a caller whose start and end run in
        different tasks (the SDK's clients must end in the task they began in); :meth:`close_held`
        stops them from any task."""
        ready, self._stop = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with self:
                ready.set()
                await self._stop.wait()

        self._held = asyncio.create_task(hold())
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({self._held, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._held.done():
            self._held.result()  # what made it end, raised here
        return self

    async def close_held(self) -> None:
        if self._held is None:
            return
        self._stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self._held
        self._held = None

    async def _start(self, config: McpServerConfig) -> _Connection:
        from mcp import Client

        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(Client(await self._transport(config, stack)))
            listed = await client.list_tools()
        except BaseException:
            with contextlib.suppress(Exception):
                await stack.aclose()
            raise
        self._stack.push_async_callback(stack.aclose)
        connection = _Connection(config, client)
        known = {tool.name for tool in self.tools}
        for remote in listed.tools:
            name = tool_name(config.name, remote.name)
            if name in known:
                self.report(
                    f"MCP server `{config.name}`: tool {remote.name!r} left out (its name {name} is taken)"
                )
                continue
            schema = remote.input_schema if isinstance(remote.input_schema, dict) else {"type": "object"}
            description = (remote.description or remote.title or remote.name).strip()
            kind = type(
                f"McpTool_{name}",
                (McpTool,),
                {
                    "name": name,
                    "description": f"{description}\n\n(From the MCP server `{config.name}`.)",
                    "parameters": schema,
                    "server": connection,
                    "remote": remote.name,
                },
            )
            self.tools.append(kind())
            connection.names.append(name)
            known.add(name)
        return connection

    async def _transport(self, config: McpServerConfig, stack: contextlib.AsyncExitStack) -> Any:
        """The client's transport: a URL (with its headers), else the stdio command (in the sandbox or
        here)."""
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        if config.url and config.headers:
            import httpx2

            http = httpx2.AsyncClient(headers=dict(config.headers), timeout=httpx2.Timeout(30.0, read=300.0))
            await stack.enter_async_context(http)
            return streamable_http_client(config.url, http_client=http)
        if config.url:
            return config.url
        if not config.command:
            raise ToolError("it has neither a command nor a url")
        argv = [config.command, *config.args]
        if config.where == "host":
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(config.env) or None)
        else:
            try:
                attached = self.sandbox.attached(argv, dict(config.env))
            except SandboxError as exc:
                raise ToolError(str(exc)) from None
            params = StdioServerParameters(
                command=attached.argv[0], args=attached.argv[1:], env=attached.env, cwd=attached.cwd
            )
        return stdio_client(params, errlog=self._errlog(config, stack))

    def _errlog(self, config: McpServerConfig, stack: contextlib.AsyncExitStack) -> TextIO:
        path = self._log_path(config)
        if path is None:
            return stack.enter_context(open(os.devnull, "w"))
        return stack.enter_context(path.open("a", encoding="utf-8"))


def _why(exc: BaseException) -> str:
    """A start failure in one line (a task group's error: its first inner one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return f"no answer within {START_TIMEOUT_S:.0f} s"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, ToolError) else str(exc)
