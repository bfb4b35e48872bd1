"""What the ACP tests share: a real ACP client from the SDK driving ``python -m clover_agent acp`` as
a subprocess (replay backend), recording every message both ways, answering permission requests
from a list, and writing files as an editor would when asked to."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import schema, spawn_agent_process, text_block
from acp.connection import StreamEvent

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


@dataclass
class RecordingClient:
    """The client side: the updates it was sent, the permission requests it answered (with the
    option ids of ``answers``, in order; none left: cancelled), the files it was asked to write."""

    answers: list[str] = field(default_factory=list)
    updates: list[Any] = field(default_factory=list)
    permissions: list[schema.RequestPermissionRequest] = field(default_factory=list)
    written: dict[str, str] = field(default_factory=dict)
    hold_permissions: bool = False  # leave permission requests unanswered (until cancelled)
    terminals: dict[str, ClientTerminal] = field(default_factory=dict)  # by terminal id
    before_answer: Callable[[], Awaitable[object]] | None = None  # run before each answer

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **_: Any
    ) -> schema.RequestPermissionResponse:
        self.permissions.append(
            schema.RequestPermissionRequest(session_id=session_id, tool_call=tool_call, options=options)
        )
        if self.before_answer is not None:
            await self.before_answer()
        if self.hold_permissions or not self.answers:
            if self.hold_permissions:
                await asyncio.Event().wait()
            return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))
        chosen = self.answers.pop(0)
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=chosen)
        )

    async def write_text_file(self, session_id: str, path: str, content: str, **_: Any) -> None:
        Path(path).write_text(content, encoding="utf-8")  # as an editor saves its buffer
        self.written[path] = content

    async def read_text_file(self, session_id: str, path: str, **_: Any) -> schema.ReadTextFileResponse:
        return schema.ReadTextFileResponse(content=Path(path).read_text(encoding="utf-8"))

    async def create_terminal(
        self, session_id: str, command: str, args: list[str] | None = None, cwd: str | None = None, **_: Any
    ) -> schema.CreateTerminalResponse:
        """Run the command as an editor runs a terminal's: a process of its own, output collected."""
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        terminal = ClientTerminal(f"term-{len(self.terminals) + 1}", [command, *(args or [])], process)
        terminal.reading = asyncio.ensure_future(terminal.read())
        self.terminals[terminal.terminal_id] = terminal
        return schema.CreateTerminalResponse(terminal_id=terminal.terminal_id)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **_: Any
    ) -> schema.TerminalOutputResponse:
        terminal = self.terminals[terminal_id]
        return schema.TerminalOutputResponse(output=terminal.output.decode(), truncated=False)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **_: Any
    ) -> schema.WaitForTerminalExitResponse:
        terminal = self.terminals[terminal_id]
        code = await terminal.process.wait()
        await terminal.reading
        return schema.WaitForTerminalExitResponse(exit_code=code if code >= 0 else None)

    async def kill_terminal(self, session_id: str, terminal_id: str, **_: Any) -> schema.KillTerminalResponse:
        terminal = self.terminals[terminal_id]
        if terminal.process.returncode is None:
            terminal.process.kill()
        terminal.killed = True
        return schema.KillTerminalResponse()

    async def release_terminal(
        self, session_id: str, terminal_id: str, **_: Any
    ) -> schema.ReleaseTerminalResponse:
        terminal = self.terminals[terminal_id]
        if terminal.process.returncode is None:
            terminal.process.kill()
        await terminal.process.wait()
        terminal.released = True
        return schema.ReleaseTerminalResponse()

    def of(self, kind: type) -> list[Any]:
        return [u for u in self.updates if isinstance(u, kind)]

    def text(self, kind: type = schema.AgentMessageChunk) -> str:
        return "".join(u.content.text for u in self.of(kind))


@dataclass
class ClientTerminal:
    """A terminal the agent asked the client for: its command line and process, what it printed."""

    terminal_id: str
    argv: list[str]
    process: asyncio.subprocess.Process
    output: bytes = b""
    reading: asyncio.Future[None] | None = None
    killed: bool = False
    released: bool = False

    async def read(self) -> None:
        assert self.process.stdout is not None
        while piece := await self.process.stdout.read(4096):
            self.output += piece


@dataclass
class Agent:
    conn: Any
    process: asyncio.subprocess.Process
    client: RecordingClient
    messages: list[StreamEvent]
    init: schema.InitializeResponse | None = None


def agent_args(replay: Path, sandbox: str = "local", *extra: str) -> list[str]:
    return ["-m", "clover_agent", "acp", "--replay", str(replay), "--sandbox", sandbox, *extra]


@contextlib.asynccontextmanager
async def running_agent(
    args: list[str],
    log: Path,
    client: RecordingClient | None = None,
    *,
    fs_write: bool = True,
    terminal: bool = False,
) -> AsyncIterator[Agent]:
    """The agent started as a subprocess (its stderr to ``log``), initialized (the client advertising
    ``fs/write_text_file`` when ``fs_write``, ``terminal/*`` when ``terminal``); every message both
    ways is in ``messages``."""
    client = client or RecordingClient()
    messages: list[StreamEvent] = []
    env = dict(os.environ)
    with log.open("ab") as stderr:
        async with spawn_agent_process(
            client,
            sys.executable,
            *args,
            env=env,
            cwd=ROOT,
            observers=[messages.append],
            transport_kwargs={"stderr": stderr.fileno(), "shutdown_timeout": 60.0},
        ) as (conn, process):
            yield await _initialized(Agent(conn, process, client, messages), fs_write, terminal)


async def _initialized(agent: Agent, fs_write: bool, terminal: bool) -> Agent:
    agent.init = await agent.conn.initialize(
        protocol_version=1,
        client_capabilities=schema.ClientCapabilities(
            fs=schema.FileSystemCapabilities(read_text_file=fs_write, write_text_file=fs_write),
            terminal=terminal,
        ),
        client_info=schema.Implementation(name="clover-tests", version="0"),
    )
    return agent


async def prompt(agent: Agent, session_id: str, text: str) -> schema.PromptResponse:
    return await agent.conn.prompt(session_id=session_id, prompt=[text_block(text)])


async def wait_until(condition: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


#: Each method's params and result, as the protocol's schema (the SDK's models, generated from
#: it) says; None: a notification.
METHODS: dict[str, tuple[type, type | None]] = {
    "initialize": (schema.InitializeRequest, schema.InitializeResponse),
    "session/new": (schema.NewSessionRequest, schema.NewSessionResponse),
    "session/load": (schema.LoadSessionRequest, schema.LoadSessionResponse),
    "session/prompt": (schema.PromptRequest, schema.PromptResponse),
    "session/set_mode": (schema.SetSessionModeRequest, schema.SetSessionModeResponse),
    "session/list": (schema.ListSessionsRequest, schema.ListSessionsResponse),
    "session/cancel": (schema.CancelNotification, None),
    "session/update": (schema.SessionNotification, None),
    "session/request_permission": (schema.RequestPermissionRequest, schema.RequestPermissionResponse),
    "fs/write_text_file": (schema.WriteTextFileRequest, schema.WriteTextFileResponse),
    "fs/read_text_file": (schema.ReadTextFileRequest, schema.ReadTextFileResponse),
    "terminal/create": (schema.CreateTerminalRequest, schema.CreateTerminalResponse),
    "terminal/output": (schema.TerminalOutputRequest, schema.TerminalOutputResponse),
    "terminal/wait_for_exit": (schema.WaitForTerminalExitRequest, schema.WaitForTerminalExitResponse),
    "terminal/kill": (schema.KillTerminalRequest, schema.KillTerminalResponse),
    "terminal/release": (schema.ReleaseTerminalRequest, schema.ReleaseTerminalResponse),
}


def _conforms(model: type, data: Any, where: str) -> None:
    """``data`` is an instance of ``model`` with nothing dropped or repaired on the way in."""
    if data is None:  # an empty result may be sent as null: only where the model has no required field
        model.model_validate({})
        return
    parsed = model.model_validate(data)
    again = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert again == data, f"{where}: {data!r} is not exactly a {model.__name__} (read back: {again!r})"


def check_conformance(messages: list[StreamEvent]) -> int:
    """Every message both ways is JSON-RPC 2.0 and, by its method, exactly what the schema says
    (params, results, error objects); returns how many were checked."""
    asked: dict[tuple[str, object], str] = {}
    for number, event in enumerate(messages):
        message, side = event.message, event.direction.value
        where = f"message {number} ({side})"
        assert message.get("jsonrpc") == "2.0", where
        method = message.get("method")
        if method is not None:
            assert method in METHODS, f"{where}: a method the tests do not expect: {method}"
            _conforms(METHODS[method][0], message.get("params"), f"{where} {method}")
            if "id" in message:
                asked[(side, message["id"])] = method
            continue
        other = "incoming" if side == "outgoing" else "outgoing"
        method = asked.pop((other, message["id"]))
        if "error" in message:
            error = message["error"]
            assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), where
        else:
            result_model = METHODS[method][1]
            assert result_model is not None, f"{where}: a response to the notification {method}"
            _conforms(result_model, message["result"], f"{where} result of {method}")
    assert not asked, f"requests never answered: {asked}"
    return len(messages)
