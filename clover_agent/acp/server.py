"""The ACP agent: the protocol's methods answered over stdio with the ``acp`` SDK's connection.

``initialize`` says what it offers (text and embedded-context prompts, ``session/load``,
``session/list``, the version); ``session/new`` builds a session for the repository at ``cwd``
from the command's options (what cannot start — no Docker, no model — is a JSON-RPC error naming
it); ``session/load`` takes up one of the repository's saved sessions, ``session/list`` lists them;
``session/prompt``, ``session/set_mode`` and ``session/cancel`` go to the
:class:`~clover_agent.acp.session.AcpSession`. Logging goes to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from acp import PROTOCOL_VERSION, Agent, RequestError, schema
from acp.core import AgentSideConnection

from clover_agent import __version__
from clover_agent.acp.session import AcpSession, Client, SessionConfig
from clover_agent.acp.transport import LineTransport, protocol_streams
from clover_agent.errors import RUN_ERRORS, ExitCode, message_of
from clover_agent.session.store import list_sessions
from clover_agent.tools.mcp import McpServerConfig, parse_servers

log = logging.getLogger("clover_agent.acp")

#: Builds a session's configuration for a repository (``cwd``), and a saved session to take up by id
#: (None: a new one); raises a :data:`RUN_ERRORS` error naming what is missing or wrong.
Configure = Callable[[Path, str | None], SessionConfig]
#: JSON-RPC error code of a session that cannot start (the server error range).
SESSION_UNAVAILABLE = -32001
#: Signals that end the command as an editor stops it (the sessions' sandboxes are removed first).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _prompt_text(blocks: list[Any]) -> str:
    """The prompt's text: text blocks as they are, embedded text resources and links named."""
    parts = []
    for block in blocks:
        if isinstance(block, schema.TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, schema.EmbeddedResourceContentBlock):
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is not None:
                parts.append(f'\n<file uri="{resource.uri}">\n{text}\n</file>\n')
        elif isinstance(block, schema.ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
    return "".join(parts)


class CloverAcpAgent:
    """The SDK's ``Agent`` (see the module docstring)."""

    def __init__(self, configure: Configure) -> None:
        self.configure = configure
        self.conn: Any = None
        self.can_write = False
        self.can_terminal = False
        self.sessions: dict[str, AcpSession] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(
        self, protocol_version: int, client_capabilities: schema.ClientCapabilities | None = None, **_: Any
    ) -> schema.InitializeResponse:
        fs = client_capabilities.fs if client_capabilities else None
        self.can_write = bool(fs and fs.write_text_file)
        self.can_terminal = bool(client_capabilities and client_capabilities.terminal)
        return schema.InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=schema.AgentCapabilities(
                load_session=True,
                prompt_capabilities=schema.PromptCapabilities(
                    image=False, audio=False, embedded_context=True
                ),
                mcp_capabilities=schema.McpCapabilities(http=True, sse=False),
                session_capabilities=schema.SessionCapabilities(list=schema.SessionListCapabilities()),
            ),
            agent_info=schema.Implementation(name="clover-agent", title="clover-agent", version=__version__),
            auth_methods=[],
        )

    async def authenticate(self, method_id: str, **_: Any) -> schema.AuthenticateResponse:
        raise RequestError.invalid_params({"details": "clover-agent needs no authentication"})

    async def _open(self, cwd: str, session_id: str | None, mcp_servers: list[Any] | None) -> AcpSession:
        try:
            config = self.configure(Path(cwd), session_id)
            config.mcp_servers = (*config.mcp_servers, *client_servers(mcp_servers or [], config.mcp_servers))
            session = AcpSession(config, Client(self.conn, self.can_write, self.can_terminal))
        except RUN_ERRORS as exc:
            raise RequestError(SESSION_UNAVAILABLE, message_of(exc), {"cwd": cwd}) from None
        try:
            await session.start()
        except RUN_ERRORS as exc:
            await session.close()
            raise RequestError(
                SESSION_UNAVAILABLE, f"the session cannot start: {message_of(exc)}", {"cwd": cwd}
            ) from None
        self.sessions[session.session_id] = session
        return session

    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None, **_: Any
    ) -> schema.NewSessionResponse:
        session = await self._open(cwd, None, mcp_servers)
        _announce_after_answer(session)
        return schema.NewSessionResponse(session_id=session.session_id, modes=session.mode_state())

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None, **_: Any
    ) -> schema.LoadSessionResponse:
        old = self.sessions.pop(session_id, None)
        if old is not None:
            await old.close()
        session = await self._open(cwd, session_id, mcp_servers)
        await session.replay_history()
        _announce_after_answer(session)
        return schema.LoadSessionResponse(modes=session.mode_state())

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **_: Any
    ) -> schema.ListSessionsResponse:
        """The saved sessions of the repository at ``cwd`` (without one: of the open sessions'
        repositories), newest first; all in one page."""
        places = [Path(cwd)] if cwd else sorted({s.repo for s in self.sessions.values()})
        found: list[schema.SessionInfo] = []
        for place in places:
            try:
                config = self.configure(place, None)
                saved = list_sessions(config.repo, config.record_key) if config.record_key else []
            except RUN_ERRORS as exc:
                raise RequestError(SESSION_UNAVAILABLE, message_of(exc), {"cwd": str(place)}) from None
            found += [
                schema.SessionInfo(
                    session_id=info.session_id,
                    cwd=str(config.repo),
                    title=info.title or None,
                    updated_at=datetime.fromtimestamp(info.updated, UTC).isoformat(),
                )
                for info in saved
            ]
        return schema.ListSessionsResponse(sessions=found)

    async def set_session_mode(
        self, session_id: str, mode_id: str, **_: Any
    ) -> schema.SetSessionModeResponse:
        session = self._session(session_id)
        try:
            await session.set_mode(mode_id)
        except KeyError:
            modes = ", ".join(m.id for m in session.modes)
            raise RequestError.invalid_params(
                {"details": f"no mode {mode_id!r}; the modes are {modes}"}
            ) from None
        return schema.SetSessionModeResponse()

    def _session(self, session_id: str) -> AcpSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError.invalid_params({"details": f"no session {session_id!r}"})
        return session

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> schema.PromptResponse:
        session = self._session(session_id)
        text = _prompt_text(prompt)
        if not text.strip():
            raise RequestError.invalid_params({"details": "the prompt has no text"})
        if session.answering:
            raise RequestError.invalid_request(
                {"details": "a prompt of this session is still being answered"}
            )
        title = " ".join(b.text for b in prompt if isinstance(b, schema.TextContentBlock))
        return schema.PromptResponse(stop_reason=await session.prompt(text, title))

    async def cancel(self, session_id: str, **_: Any) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.cancel()

    async def close_all(self) -> None:
        for session in list(self.sessions.values()):
            try:
                await session.close()
            except (*RUN_ERRORS, OSError) as exc:
                log.warning("closing session %s: %s", session.session_id, exc)
        self.sessions.clear()


def _announce_after_answer(session: AcpSession) -> None:
    """Send the session's commands and mode once the answer naming the session is out: the task runs
    when the handler's task next waits, and the answer is written before that (``LineTransport``
    writes without waiting when its lock is free)."""
    task = asyncio.get_running_loop().create_task(session.announce())
    _ANNOUNCING.add(task)
    task.add_done_callback(_ANNOUNCING.discard)


_ANNOUNCING: set[asyncio.Task[None]] = set()


def client_servers(given: list[Any], configured: tuple[McpServerConfig, ...]) -> list[McpServerConfig]:
    """The MCP servers a client passes in session/new or session/load, as ours. Its stdio servers are
    programs of the editor's configuration (an absolute path on this machine): they run on this
    machine, as the editor would run them, and their calls are asked about. A name already taken
    (by the user's settings) gets a suffix; SSE servers are refused (the protocol's stdio and
    HTTP are offered)."""
    taken = {server.name for server in configured}
    found: list[McpServerConfig] = []
    for server in given:
        name = base = (
            re.sub(r"[^A-Za-z0-9_-]", "_", str(getattr(server, "name", "")) or "client") or "client"
        )[:28]
        number = 2
        while name in taken:
            name, number = f"{base}_{number}", number + 1
        table: dict[str, Any]
        if isinstance(server, schema.McpServerStdio):
            env = {v.name: v.value for v in server.env or []}
            table = {"command": server.command, "args": list(server.args), "env": env, "where": "host"}
        elif isinstance(server, schema.HttpMcpServer):
            table = {"url": server.url, "headers": {h.name: h.value for h in server.headers or []}}
        else:
            raise RequestError.invalid_params(
                {"details": f"MCP server {base!r}: only stdio and http are supported"}
            )
        try:
            (config,) = parse_servers({name: table}, origin="client")
        except ValueError as exc:
            raise RequestError.invalid_params({"details": f"MCP server {base!r}: {exc}"}) from None
        found.append(config)
        taken.add(name)
    return found


async def serve(configure: Configure) -> bool:
    """Answer the protocol on stdin/stdout until the client closes stdin (True) or SIGTERM / SIGHUP
    stops it (False); every session's sandbox is removed either way."""
    reader, writer = await protocol_streams()
    agent = CloverAcpAgent(configure)
    # The SDK's Agent protocol lists every method; those this agent leaves out (forking or closing
    # sessions, config options, extensions) the SDK's router answers "method not found".
    conn = AgentSideConnection(cast(Agent, agent), LineTransport(reader, writer), listening=False)
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    stopped: list[int] = []

    def stop(number: int) -> None:
        stopped.append(number)
        me.cancel()  # the SDK's receive loop ends on it (and swallows it)

    for number in STOP_SIGNALS:
        loop.add_signal_handler(number, stop, number)
    try:
        await conn.listen()
    except asyncio.CancelledError:
        if not stopped:
            raise
    finally:
        if stopped:
            me.uncancel()  # the sessions are closed below, then the command ends
        for number in STOP_SIGNALS:
            loop.remove_signal_handler(number)
        await agent.close_all()
        await conn._conn.close()
    return not stopped


def run(configure: Configure) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="clover-agent acp: %(message)s")
    return 0 if asyncio.run(serve(configure)) else int(ExitCode.INTERRUPTED)
