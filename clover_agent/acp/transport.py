"""The protocol's stdio framing: one JSON-RPC message a line, and stdout for nothing else.

:func:`protocol_streams` moves the process's stdout (fd 1) to a private descriptor for the protocol
and points fd 1 at stderr, so a stray print, or a child process (git, docker, a test run) writing
to its inherited stdout, cannot corrupt the stream. :class:`LineTransport` is the SDK's message
transport over those streams; unlike the SDK's own it answers a line that is not JSON with a
JSON-RPC parse error (-32700) and a message that is not a request, notification or response with
an invalid-request error (-32600), then reads on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

log = logging.getLogger("clover_agent.acp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
#: The longest line read (a prompt with embedded files can be large).
LINE_LIMIT = 64 * 1024 * 1024


class _Pipe(asyncio.Protocol):
    """Writes with back-pressure (what ``StreamWriter.drain`` waits on)."""

    def __init__(self) -> None:
        self._paused = False
        self._waiters: list[asyncio.Future[None]] = []

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def _drain_helper(self) -> None:
        if self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


async def protocol_streams() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """stdin as a reader and the original stdout as a writer; fd 1 is stderr from here on."""
    loop = asyncio.get_running_loop()
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pipe = _Pipe()
    transport, _ = await loop.connect_write_pipe(lambda: pipe, os.fdopen(protocol_fd, "wb", buffering=0))
    return reader, asyncio.StreamWriter(transport, pipe, None, loop)


def problem(message: Any) -> str | None:
    """Why a decoded line is not a JSON-RPC 2.0 message, if it is not."""
    if not isinstance(message, dict):
        return "a message must be a JSON object"
    if message.get("jsonrpc") != "2.0":
        return 'a message must have "jsonrpc": "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return "method must be a string"
        if "params" in message and not isinstance(message["params"], dict | list | type(None)):
            return "params must be an object or an array"
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None
    return "a message must be a request, a notification or a response"


class LineTransport:
    """JSON-RPC messages as lines of JSON on ``reader`` / ``writer`` (the SDK's ``Transport``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._closed = False
        self._skipping = False  # the rest of a line over LINE_LIMIT is being dropped

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        async with self._lock:
            if self._closed:
                raise ConnectionError("the connection is closed")
            self._writer.write(data)
            await self._writer.drain()

    async def _error(self, code: int, text: str, request_id: Any = None) -> None:
        await self.send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}})

    async def receive(self) -> dict[str, Any] | None:
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial
                if not line.strip():
                    return None
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)  # dropped, up to the line's end
                self._skipping = True
                continue
            if self._skipping:
                self._skipping = False
                await self._error(INVALID_REQUEST, f"Invalid Request: a line over {LINE_LIMIT} bytes")
                continue
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                log.warning("not JSON: %s", exc)
                await self._error(PARSE_ERROR, f"Parse error: {exc}")
                continue
            why = problem(message)
            if why is not None:
                request_id = message.get("id") if isinstance(message, dict) else None
                if not isinstance(request_id, str | int) or isinstance(request_id, bool):
                    request_id = None
                await self._error(INVALID_REQUEST, f"Invalid Request: {why}", request_id)
                continue
            return message

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            self._writer.close()
