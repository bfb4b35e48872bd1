"""The HTTP side of the ``openai`` backend: one JSON POST, its answer read whole or as server-sent
events, closable from the awaiting side at any moment.

The standard library's ``http.client`` runs in a daemon thread per request (``threads.py``), so an
interrupted agent never waits on a socket and no dependency is added. A server that cannot be
reached or stops sending is a :class:`BackendUnavailable` naming the URL; an answer with an error
status is a :class:`StatusError`, which the backend retries or turns into its own message.
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

from clover_agent.backends.base import BackendUnavailable
from clover_agent.backends.threads import iterate_in_daemon_thread, run_in_daemon_thread


class StatusError(Exception):
    """The server answered with an error: an HTTP status, or (status 200) an error event or an
    answer that is not what was asked for."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class HangUp:
    """Closes one request's connection from the awaiting side at any moment: before it exists (then
    as soon as it does), while the reader thread waits for the answer, or after it is read. Shutting
    the socket down wakes a thread blocked on it and tells the server to stop generating."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._done = False

    def connected(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connection, done = connection, self._done
        if done:
            _close(connection)

    def __call__(self) -> None:
        with self._lock:
            self._done, connection = True, self._connection
        if connection is not None:
            _close(connection)


def _close(connection: http.client.HTTPConnection) -> None:
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the other side
    connection.close()


def iter_sse_data(lines: Iterator[bytes]) -> Iterator[str]:
    """The ``data`` payloads of a server-sent-events stream (multi-line data joined by newlines;
    comments, ``event:`` and ``id:`` fields skipped)."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def describe_error(error: Any) -> str:
    """The message of an ``error`` member (an object with ``message``, or a string)."""
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error))
    return str(error)


def error_detail(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:500] or "(no body)"
    if isinstance(parsed, dict) and "error" in parsed:
        return describe_error(parsed["error"])[:500]
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:500]
    return text[:500]


def _why_unreachable(exc: BaseException, connect_timeout: float) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(exc, socket.gaierror):
        return "the host name does not resolve"
    if isinstance(exc, TimeoutError):
        return f"no answer within {connect_timeout:g} s"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    return str(exc) or type(exc).__name__


class JsonPostClient:
    """POSTs JSON to ``url``. ``timeout`` bounds each wait for data (a whole answer, or the gap
    between streamed events); ``connect_timeout`` bounds reaching the server."""

    def __init__(self, url: str, *, timeout: float, connect_timeout: float) -> None:
        parts = urlsplit(url)
        self.url = url
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._scheme, self._host, self._port, self._path = (
            parts.scheme,
            parts.hostname,
            parts.port,
            parts.path,
        )

    async def post(self, payload: bytes, headers: dict[str, str], hang_up: HangUp) -> dict[str, Any]:
        """The whole answer, a JSON object."""
        return await run_in_daemon_thread(
            functools.partial(self._read_whole, payload, headers, hang_up), name="clover-openai-request"
        )

    async def events(self, payload: bytes, headers: dict[str, str], hang_up: HangUp) -> AsyncIterator[str]:
        """The data of each server-sent event as it comes, up to ``[DONE]``."""

        def read() -> Iterator[str]:
            try:
                _, response = self._open(payload, headers, hang_up.connected)
                yield from iter_sse_data(iter(response.readline, b""))
            except (OSError, http.client.HTTPException) as exc:
                raise BackendUnavailable(self._stopped(exc)) from None

        data = iterate_in_daemon_thread(read, name="clover-openai-stream")
        async with aclosing(data):
            async for item in data:
                if item.strip() == "[DONE]":
                    return
                yield item

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """GET ``path`` on the server (blocking): its status and up to 1 MiB of its body;
        :class:`BackendUnavailable` when it cannot be reached or stops answering."""
        connection = self._connect()
        try:
            connection.sock.settimeout(self.connect_timeout)
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            return response.status, response.read(1 << 20)
        except (OSError, http.client.HTTPException) as exc:
            raise BackendUnavailable(self._stopped(exc)) from None
        finally:
            connection.close()

    def reach(self) -> None:
        """Connect to the server (TCP, and TLS for https) and hang up: :class:`BackendUnavailable`
        saying why when it cannot be reached (blocking; seconds at most: ``connect_timeout``)."""
        self._connect().close()

    def _connect(self) -> http.client.HTTPConnection:
        """A connection to the server (blocking), or :class:`BackendUnavailable` saying why not."""
        connection_type = (
            http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        )
        assert self._host is not None  # OpenAIBackend refuses a URL without a host
        connection = connection_type(self._host, self._port, timeout=self.connect_timeout)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise BackendUnavailable(self._unreachable(_why_unreachable(exc, self.connect_timeout))) from exc
        return connection

    def _open(
        self,
        payload: bytes,
        headers: dict[str, str],
        on_connected: Callable[[http.client.HTTPConnection], None] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Connect, send, and return the response once its status is 200 (blocking).
        ``on_connected`` gets the connection before the request is sent, so another thread can close
        it (which ends the wait for the answer)."""
        connection = self._connect()
        if on_connected is not None:
            on_connected(connection)
        try:
            connection.sock.settimeout(self.timeout)
            connection.request("POST", self._path, body=payload, headers=headers)
            response = connection.getresponse()
            if response.status != 200:
                detail = error_detail(response.read(65536))
                raise StatusError(response.status, detail)
        except StatusError:
            connection.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise BackendUnavailable(self._stopped(exc)) from exc
        return connection, response

    def _read_whole(self, payload: bytes, headers: dict[str, str], hang_up: HangUp) -> dict[str, Any]:
        connection, response = self._open(payload, headers, hang_up.connected)
        try:
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise BackendUnavailable(self._stopped(exc)) from exc
        finally:
            connection.close()
        try:
            parsed = json.loads(body)
        except ValueError:
            raise StatusError(200, f"the answer is not JSON: {body[:300]!r}") from None
        if not isinstance(parsed, dict):
            raise StatusError(200, f"the answer is not a JSON object: {body[:300]!r}")
        return parsed

    def _unreachable(self, reason: str) -> str:
        return (
            f"Cannot reach the model server at {self.url}: {reason}.\n"
            "Check that the OpenAI-compatible server (e.g. SGLang serving Clover) is running and reachable "
            "from this machine, and that --base-url (or CLOVER_BASE_URL) is its API root, "
            "e.g. http://HOST:30000/v1."
        )

    def _stopped(self, exc: BaseException) -> str:
        reason = (
            f"no data for {self.timeout:g} s"
            if isinstance(exc, TimeoutError)
            else str(exc) or type(exc).__name__
        )
        return f"The model server at {self.url} stopped answering: {reason}. Check the server's log."
