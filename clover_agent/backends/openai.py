"""The ``openai`` backend: any OpenAI-compatible chat-completions server (e.g. SGLang serving Clover).

POST ``{base_url}/chat/completions`` with the messages and the tools, streamed (server-sent events)
or not. Tool calls the server returns as structured ``tool_calls`` are used as they are (validated
against the tools' schemas); a server that returns none (no tool parser configured) gets its text
parsed with the Qwen3.6 protocol. ``reasoning_content`` is taken when the server splits reasoning
out, else ``<think>`` is split from the text.

HTTP is the standard library's ``http.client`` in a daemon thread per request (``threads.py``), so
an interrupted agent never waits on a socket and no dependency is added.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from clover_agent.backends.base import (
    BackendEvent,
    BackendUnavailable,
    EventCallback,
    FinishReason,
    ModelBackend,
    ModelTurn,
    estimate_tokens,
)
from clover_agent.backends.threads import iterate_in_daemon_thread, run_in_daemon_thread
from clover_agent.errors import UsageError
from clover_agent.protocol import (
    ToolCall,
    format_assistant_text,
    format_error_message,
    new_call_id,
    tool_call_problem,
    tool_parameters,
)

#: Statuses worth another try: rate limited, or the server (or a proxy) momentarily failing.
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


class _StatusError(Exception):
    """The server answered with an error: an HTTP status, or (status 200) an error event or an
    answer that is not a chat completion."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class _HangUp:
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


@dataclass
class _PartialCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class ChatCompletionAccumulator:
    """Builds one assistant message from streamed chunks (or one non-streamed response): text and
    reasoning concatenated, tool-call deltas merged by their ``index``."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    #: Whether a streamed chunk carried the answer's choice (a usage-only chunk has ``choices: []``).
    has_choice: bool = False

    def add_chunk(self, chunk: dict[str, Any], on_event: EventCallback | None) -> None:
        if isinstance(chunk.get("error"), dict | str):
            raise _StatusError(200, _describe_error(chunk["error"]))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in _objects(chunk.get("choices")):
            if choice.get("index", 0) != 0:
                continue
            self.has_choice = True
            delta = _object(choice.get("delta"))
            reasoning = _text(delta.get("reasoning_content") or delta.get("reasoning"))
            if reasoning:
                self.reasoning += reasoning
                if on_event:
                    on_event(BackendEvent(kind="reasoning", text=reasoning))
            content = _text(delta.get("content"))
            if content:
                self.content += content
                if on_event:
                    on_event(BackendEvent(kind="text", text=content))
            for position, call_delta in enumerate(_objects(delta.get("tool_calls"))):
                index = call_delta.get("index", position)
                partial = self.calls.setdefault(index if isinstance(index, int) else position, _PartialCall())
                partial.id = _text(call_delta.get("id")) or partial.id
                function = _object(call_delta.get("function"))
                partial.name += _text(function.get("name"))
                partial.arguments += _arguments_text(function.get("arguments"))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def add_message(self, response: dict[str, Any]) -> None:
        if isinstance(response.get("usage"), dict):
            self.usage = response["usage"]
        choices = _objects(response.get("choices"))
        if not choices:
            raise _StatusError(200, f"the answer has no choices: {json.dumps(response)[:300]}")
        message = _object(choices[0].get("message"))
        self.content = _text(message.get("content"))
        self.reasoning = _text(message.get("reasoning_content") or message.get("reasoning"))
        for index, call in enumerate(_objects(message.get("tool_calls"))):
            function = _object(call.get("function"))
            self.calls[index] = _PartialCall(
                id=_text(call.get("id")) or None,
                name=_text(function.get("name")),
                arguments=_arguments_text(function.get("arguments")),
            )
        self.finish_reason = _text(choices[0].get("finish_reason")) or None

    def turn(self, tools: list[dict[str, Any]], estimate_prompt: Callable[[], int]) -> ModelTurn:
        """The assistant turn: structured calls when the server sent any, else calls parsed from the
        text. ``estimate_prompt`` is called only when the server reported no prompt size."""
        prompt_tokens = _count(self.usage.get("prompt_tokens")) or estimate_prompt()
        completion_tokens = _count(self.usage.get("completion_tokens")) or estimate_tokens(
            self.reasoning + self.content
        )
        finish: FinishReason = "length" if self.finish_reason == "length" else "stop"
        if not self.calls:
            raw = format_assistant_text(self.content, self.reasoning or None, [])
            # Keep an unsplit "<think>" in the text for the protocol when the server did not split it.
            text = raw if self.reasoning else self.content
            return ModelTurn.from_text(
                text,
                tools,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                finish_reason=finish if finish == "length" else None,
            )
        parameters = tool_parameters(tools)
        calls: list[ToolCall] = []
        problems: list[str] = []
        for index in sorted(self.calls):
            partial = self.calls[index]
            try:
                arguments = json.loads(partial.arguments or "{}")
            except json.JSONDecodeError as exc:
                problems.append(f"the arguments of `{partial.name}` are not valid JSON ({exc.msg})")
                continue
            if not isinstance(arguments, dict):
                problems.append(f"the arguments of `{partial.name}` must be an object")
                continue
            problem = tool_call_problem(partial.name, arguments, parameters)
            if problem:
                problems.append(problem)
            calls.append(ToolCall(partial.name, arguments, partial.id or new_call_id()))
        raw = format_assistant_text(self.content, self.reasoning or None, calls)
        return ModelTurn(
            # with a format error, the model sees what it wrote: its text and its calls
            content=format_assistant_text(self.content, None, calls) if problems else self.content.strip(),
            reasoning=self.reasoning.strip() or None,
            tool_calls=[] if problems else calls,
            raw=raw,
            format_error=format_error_message(problems) if problems else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason="tool_calls" if not problems and finish == "stop" else finish,
        )


# Servers differ and some send odd shapes; these readers take what is usable and ignore the rest.
def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _objects(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _arguments_text(value: Any) -> str:
    """Tool-call arguments as JSON text (some servers send an object instead of a string)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False) if value is not None else ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error))
    return str(error)


def _error_detail(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:500] or "(no body)"
    if isinstance(parsed, dict) and "error" in parsed:
        return _describe_error(parsed["error"])[:500]
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


class OpenAIBackend(ModelBackend):
    """Chat completions against ``base_url`` (the API root, e.g. ``http://HOST:30000/v1``).

    ``timeout`` bounds each wait for data from the server (a whole non-streamed answer, or the gap
    between streamed chunks); ``connect_timeout`` bounds reaching it. Statuses 429 and 5xx are retried
    ``retries`` times with a doubling delay; anything else is one :class:`BackendUnavailable`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model_name: str = "default",
        api_key: str | None = None,
        stream: bool = True,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        retries: int = 2,
        retry_delay: float = 1.0,
        context_window: int = 131072,
        max_tokens: int | None = None,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(
                f"--base-url must be an http(s) URL such as http://HOST:30000/v1, got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._path = f"{parts.path}/chat/completions"
        self.model_name = model_name
        self.api_key = api_key  # from the settings (CLOVER_API_KEY, OPENAI_API_KEY); None: no key
        self.stream = stream
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.retry_delay = retry_delay
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.name = f"openai:{model_name}@{parts.netloc}"

    # -- request -------------------------------------------------------------------------------------

    def request_body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The JSON body: messages with tool-call arguments as JSON strings, as the API wants them."""
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": [_api_message(m) for m in messages],
            "stream": self.stream,
        }
        if tools:
            body["tools"] = tools
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if self.stream else "application/json",
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _open(
        self,
        payload: bytes,
        on_connected: Callable[[http.client.HTTPConnection], None] | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Connect, send, and return the response once its status is 200 (blocking).
        ``on_connected`` gets the connection before the request is sent, so another thread can close
        it (which ends the wait for the answer)."""
        connection_type = (
            http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        )
        connection = connection_type(self._host, self._port, timeout=self.connect_timeout)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise BackendUnavailable(self._unreachable(_why_unreachable(exc, self.connect_timeout))) from exc
        if on_connected is not None:
            on_connected(connection)
        try:
            connection.sock.settimeout(self.timeout)
            connection.request("POST", self._path, body=payload, headers=self._headers())
            response = connection.getresponse()
            if response.status != 200:
                detail = _error_detail(response.read(65536))
                raise _StatusError(response.status, detail)
        except _StatusError:
            connection.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise BackendUnavailable(self._stopped(exc)) from exc
        return connection, response

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

    def _status_message(self, error: _StatusError) -> str:
        if error.status in (401, 403):
            hint = "Set the API key in CLOVER_API_KEY (or OPENAI_API_KEY)."
        elif error.status == 404:
            hint = "Is --base-url the API root (usually ending in /v1) and --model-name a model it serves?"
        elif error.status == 200:
            hint = "Check the server's log."
        else:
            hint = "Check the server's log and the request limits (context length, max tokens)."
        status = "an error" if error.status == 200 else f"HTTP {error.status}"
        return f"The model server at {self.url} answered {status}: {error.detail}\n{hint}"

    # -- completion ----------------------------------------------------------------------------------

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_event: EventCallback | None = None,
    ) -> ModelTurn:
        payload = json.dumps(self.request_body(messages, tools), ensure_ascii=False).encode("utf-8")
        attempt = 0
        while True:
            accumulator = ChatCompletionAccumulator()
            hang_up = _HangUp()
            try:
                if self.stream:
                    await self._read_stream(payload, accumulator, on_event, hang_up)
                else:
                    accumulator.add_message(
                        await run_in_daemon_thread(
                            functools.partial(self._read_whole, payload, hang_up),
                            name="clover-openai-request",
                        )
                    )
                break
            except _StatusError as error:
                if error.status not in RETRYABLE_STATUSES or attempt >= self.retries:
                    raise BackendUnavailable(self._status_message(error)) from None
            finally:
                hang_up()  # done, failed or cancelled: the connection is not needed any more
            await asyncio.sleep(self.retry_delay * 2**attempt)
            attempt += 1
        return accumulator.turn(tools, lambda: self.count_tokens(messages, tools))

    def _read_whole(self, payload: bytes, hang_up: _HangUp) -> dict[str, Any]:
        connection, response = self._open(payload, hang_up.connected)
        try:
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise BackendUnavailable(self._stopped(exc)) from exc
        finally:
            connection.close()
        try:
            parsed = json.loads(body)
        except ValueError:
            raise _StatusError(200, f"the answer is not JSON: {body[:300]!r}") from None
        if not isinstance(parsed, dict):
            raise _StatusError(200, f"the answer is not a JSON object: {body[:300]!r}")
        return parsed

    async def _read_stream(
        self,
        payload: bytes,
        accumulator: ChatCompletionAccumulator,
        on_event: EventCallback | None,
        hang_up: _HangUp,
    ) -> None:

        def events() -> Iterator[str]:
            try:
                _, response = self._open(payload, hang_up.connected)
                yield from iter_sse_data(iter(response.readline, b""))
            except (OSError, http.client.HTTPException) as exc:
                raise BackendUnavailable(self._stopped(exc)) from None

        data = iterate_in_daemon_thread(events, name="clover-openai-stream")
        received: list[str] = []
        async with aclosing(data):
            async for item in data:
                if item.strip() == "[DONE]":
                    break
                received.append(item)
                try:
                    chunk = json.loads(item)
                except ValueError:
                    raise _StatusError(200, f"a streamed event is not JSON: {item[:300]!r}") from None
                if isinstance(chunk, dict):
                    accumulator.add_chunk(chunk, on_event)
        if not accumulator.has_choice:  # not an empty answer: no answer at all
            last = f"; the last: {received[-1][:300]}" if received else ""
            raise _StatusError(200, f"the streamed answer has no choices ({len(received)} event(s){last})")


def _api_message(message: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in message.items() if value is not None}
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            function = dict(call.get("function") or {})
            if not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
            calls.append({**call, "type": call.get("type", "function"), "function": function})
        out["tool_calls"] = calls
    return out
