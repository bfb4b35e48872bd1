"""The routes: ``POST /v1/chat/completions`` (whole or streamed as server-sent events), ``GET
/v1/models``, ``GET /health``, ``GET /metrics``. Each completion is one request of the batch
engine; a client that goes away cancels it (a watcher reads the connection's disconnect). The
API key is compared in constant time. What a web page can send is refused: a body not declared
JSON (no CORS preflight guards it) and, without a key, a Host not naming this machine (DNS rebinding)."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

import anyio.to_thread
import jinja2
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from clover_agent.backends.engine import DEFAULT_MAX_NEW_TOKENS, EngineBackend
from clover_agent.engine.batching import BatchEngine, BatchRequest, EngineClosed, QueueFull, RequestCancelled
from clover_agent.engine.decoding.sampling import GenerationResult, SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone, StreamEvent
from clover_agent.serve.answer import AnswerStream, chunk_body, completion_body, tokens_through, usage
from clover_agent.serve.errors import ApiError, bad_request
from clover_agent.serve.metrics import CONTENT_TYPE, ServeMetrics
from clover_agent.serve.request import ChatRequest, read_chat_request

log = logging.getLogger("clover_agent.serve")

#: The id every server answers to, besides the checkpoint folder's name.
MODEL_ID = "clover"
#: Largest request body read (bytes): a full 128K-token context is well under it.
MAX_BODY_BYTES = 32 << 20
#: Seconds a request body may take to arrive in full (408 past them): a client that declares a body
#: and sends only part of it, or trickles it, holds no connection and no request open for long.
BODY_TIMEOUT_S = 60.0


@dataclass
class Served:
    """What one server serves: the checkpoint (prompt rendering, tokenizer, config) through the
    engine backend's code, the batch engine decoding it, and the rules (API key, model names)."""

    backend: EngineBackend
    batch: BatchEngine
    api_key: str | None = field(default=None, repr=False)  # never in a log line
    names: tuple[str, ...] = ()
    #: Most tokens an answer may take (a request's ``max_tokens`` is capped by it; the default when absent).
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    #: Tokens a conversation may reach, prompt and answer (what the memory plan was made for); None:
    #: the model's window.
    context_tokens: int | None = None
    #: Largest request body read (bytes).
    max_body_bytes: int = MAX_BODY_BYTES
    #: Seconds a request body may take to arrive.
    body_timeout_s: float = BODY_TIMEOUT_S
    draining: bool = False
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty or blank (a client sending 'Bearer' alone would match it)")
        if not self.names:  # a folder named "clover" is listed once
            self.names = tuple(dict.fromkeys((MODEL_ID, self.backend.model_dir.name)))

    @property
    def context_window(self) -> int:
        return min(self.context_tokens or self.backend.context_window, self.backend.context_window)


@dataclass
class _Job:
    """One completion in flight: its request, its answer so far, what it counted."""

    chat: ChatRequest
    prompt_ids: list[int]
    request: BatchRequest
    answer: AnswerStream
    ident: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    result: GenerationResult | None = None
    #: The tokens committed so far, and after a stop string how many of them wrote the text up to
    #: its end (the answer's tokens: those past it were decoded but are no part of it).
    token_ids: list[int] = field(default_factory=list)
    answer_tokens: int | None = None
    client_gone: bool = False

    def usage(self) -> dict[str, Any]:
        if self.answer_tokens is not None:
            completion = self.answer_tokens
        else:
            completion = len(self.result.token_ids) if self.result is not None else len(self.token_ids)
        cached = (
            self.result.reused_tokens if self.result is not None else getattr(self.request.call, "reused", 0)
        )
        return usage(len(self.prompt_ids), completion, cached)

    def finish_reason(self) -> Any:
        return self.answer.finish_reason(self.result.finish_reason if self.result is not None else None)


def _error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _authorize(served: Served, request: Request) -> None:
    if served.api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), served.api_key.encode()):
        raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")


def _declared_json(request: Request) -> None:
    """:class:`ApiError` 415 unless the body is declared JSON: a web page may POST text/plain, a
    form or an untyped body to any address without the browser asking the server first."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise ApiError(
            415, "the request body must be sent as JSON (Content-Type: application/json)",
            code="unsupported_media_type",
        )  # fmt: skip


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, no port) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a Host header, without its port or an IPv6 address's brackets."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


class LoopbackHostOnly:
    """Without an API key (the server then listens on loopback only), a request whose Host does
    not name this machine is 403: a page that rebinds its own domain to 127.0.0.1 sends its own."""

    def __init__(self, app: ASGIApp, served: Served) -> None:
        self.app = app
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.served.api_key is None:
            host = Headers(scope=scope).get("host", "")
            if not is_loopback(_host_name(host)):
                refused = ApiError(
                    403, f"the Host {host!r} is not this machine; a server without an API key answers "
                    "only to localhost and loopback addresses", code="host_not_allowed",
                )  # fmt: skip
                await _error(refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _json_body(request: Request, limit: int, timeout: float) -> Any:
    """The body as JSON, read no further than ``limit`` bytes: a body without a length (chunked)
    is counted as it comes, so no client makes the server hold more than that; and in ``timeout``
    seconds (408 past them)."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {timeout:g} s", code="request_timeout"
        ) from None
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise bad_request(f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body nests arrays and objects too deeply") from None


def _prompt_ids(served: Served, chat: ChatRequest, thinking: bool) -> list[int]:
    try:
        text = served.backend.prompt(chat.messages, chat.tools, enable_thinking=thinking)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        raise bad_request(f"the chat template cannot render these messages: {exc}", "messages") from None
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate (JSON's "\\ud800"): no tokenizer takes it
        raise bad_request(
            f"the messages or tools hold a lone surrogate ({text[exc.start]!r}), which is not Unicode text",
            "messages",
        ) from None
    longest = served.backend.tokenizer.longest_token_chars
    if len(text) > served.context_window * longest:  # refused unread: tokenising it is seconds of CPU
        raise bad_request(
            f"the prompt has {len(text)} characters; the model's context window is {served.context_window} "
            f"tokens, which write at most {longest} characters each",
            param="messages",
            code="context_length_exceeded",
        )
    return served.backend.tokenizer.encode(text)


def _params(served: Served, chat: ChatRequest, prompt_length: int, thinking: bool) -> SamplingParams:
    room = served.context_window - prompt_length
    if room <= 0:
        raise bad_request(
            f"the prompt has {prompt_length} tokens; the model's context window is {served.context_window} "
            "tokens and leaves no room for an answer",
            param="messages",
            code="context_length_exceeded",
        )
    base = SamplingParams.coding(served.backend.config)
    wanted = min(chat.max_tokens or served.max_new_tokens, served.max_new_tokens, room)
    try:
        return base.with_changes(max_new_tokens=wanted, thinking=thinking, **chat.sampling)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def _submit(served: Served, prompt_ids: list[int], params: SamplingParams) -> BatchRequest:
    try:
        return served.batch.submit(prompt_ids, params)
    except QueueFull as exc:
        seconds = max(1, math.ceil(exc.retry_after))
        raise ApiError(
            429, f"the server is busy: {exc}", code="queue_full", headers={"Retry-After": str(seconds)}
        ) from None
    except EngineClosed as exc:
        raise ApiError(503, str(exc), code="draining") from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None


async def _start(served: Served, request: Request) -> _Job:
    if served.draining:
        raise ApiError(503, "the server is shutting down and takes no new requests", code="draining")
    _authorize(served, request)
    _declared_json(request)
    chat = read_chat_request(await _json_body(request, served.max_body_bytes, served.body_timeout_s))
    if chat.model not in served.names:
        raise ApiError(
            404, f"the model {chat.model!r} is not served here; this server serves: {', '.join(served.names)}",
            param="model", code="model_not_found",
        )  # fmt: skip
    thinking = chat.enable_thinking if chat.enable_thinking is not None else served.backend.enable_thinking
    prompt_ids = await anyio.to_thread.run_sync(_prompt_ids, served, chat, thinking)
    params = _params(served, chat, len(prompt_ids), thinking)
    answer = AnswerStream(
        chat.tools, thinking=thinking, stop=chat.stop, one_call=not chat.parallel_tool_calls
    )
    return _Job(chat, prompt_ids, _submit(served, prompt_ids, params), answer)


async def _deltas(served: Served, job: _Job) -> AsyncIterator[dict[str, Any]]:
    """The answer's deltas as the engine commits blocks; a stop string ends the request early."""
    tokenizer = served.backend.tokenizer
    events = cast("AsyncGenerator[StreamEvent, None]", job.request.aevents())  # closed on a stop string
    async with aclosing(events):
        async for event in events:
            if isinstance(event, BlockCommitted):
                job.token_ids += event.token_ids
                text = event.text if event.text is not None else tokenizer.decode(event.token_ids)
                for delta in job.answer.feed(text):
                    yield delta
                if job.answer.stopped:
                    job.request.finish()  # the answer is complete: free the engine's slot now
                    job.answer_tokens = (
                        tokens_through(tokenizer.decode, job.token_ids, job.answer.stop.end)
                        if job.answer.stop.hit
                        else len(job.token_ids)  # the one call allowed: every token decoded so far
                    )
                    break
            elif isinstance(event, GenerationDone):
                job.result = event.result
    for delta in job.answer.finish():
        yield delta


async def _cancel_on_disconnect(receive: Receive, job: _Job) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.client_gone = True
            job.request.cancel()
            return


def _watch(request: Request, job: _Job) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(_cancel_on_disconnect(request.receive, job))


#: What a client is told when the server cancelled its request (a drain that ran out of time).
SHUT_DOWN = ApiError(503, "the server shut down before the answer was complete", code="shutdown")


def _sse(body: dict[str, Any] | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def _stream(served: Served, job: _Job, watcher: asyncio.Task[None]) -> AsyncIterator[bytes]:
    model, outcome = job.chat.model, "cancelled"
    try:
        yield _sse(chunk_body(job.ident, job.created, model, {"role": "assistant", "content": ""}))
        async for delta in _deltas(served, job):
            yield _sse(chunk_body(job.ident, job.created, model, delta))
        yield _sse(chunk_body(job.ident, job.created, model, {}, job.finish_reason()))
        if job.chat.include_usage:
            yield _sse(chunk_body(job.ident, job.created, model, None, used=job.usage()))
        yield _sse("[DONE]")
        outcome = "completed"
    except RequestCancelled:
        if not job.client_gone:
            yield _sse(SHUT_DOWN.body())
            yield _sse("[DONE]")
    except Exception as exc:  # the engine failed this request: tell the client in the stream
        outcome = "failed"
        log.warning("%s failed: %s: %s", job.request.id, type(exc).__name__, exc)
        yield _sse(ApiError(500, f"decoding failed: {type(exc).__name__}: {exc}").body())
        yield _sse("[DONE]")
    finally:
        watcher.cancel()
        job.request.cancel()  # no-op once it ended
        _count(served, job, outcome)


def _count(served: Served, job: _Job, outcome: str) -> None:
    if outcome != "completed":
        served.metrics.count(outcome)
        return
    used, request = job.usage(), job.request
    served.metrics.count(
        outcome,
        prompt=used["prompt_tokens"],
        completion=used["completion_tokens"],
        cached=used["prompt_tokens_details"]["cached_tokens"],
        first_block_s=None if request.first_block is None else request.first_block - request.submitted,
        request_s=time.monotonic() - request.submitted,
    )


async def _whole(served: Served, job: _Job, watcher: asyncio.Task[None]) -> Response:
    outcome = "cancelled"
    try:
        async for _ in _deltas(served, job):
            pass
        outcome = "completed"
        body = completion_body(
            job.ident, job.created, job.chat.model, job.answer.message(), job.finish_reason(), job.usage()
        )
        return JSONResponse(body)
    except RequestCancelled:
        return Response(status_code=499) if job.client_gone else _error(SHUT_DOWN)
    except Exception as exc:
        outcome = "failed"
        log.warning("%s failed: %s: %s", job.request.id, type(exc).__name__, exc)
        return _error(ApiError(500, f"decoding failed: {type(exc).__name__}: {exc}"))
    finally:
        watcher.cancel()
        job.request.cancel()
        _count(served, job, outcome)


#: ApiError status -> the outcome counted for it.
_REFUSED = {401: "unauthorized", 429: "overloaded", 503: "unavailable"}


def chat_completions(served: Served) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            job = await _start(served, request)
        except ApiError as error:
            served.metrics.count(_REFUSED.get(error.status, "rejected"))
            return _error(error)
        # Watched from here on: a client gone before its stream starts still cancels its request.
        watcher = _watch(request, job)
        if job.chat.stream:
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            stream = _stream(served, job, watcher)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        return await _whole(served, job, watcher)

    return endpoint


def _guarded(
    served: Served, handler: Callable[[Request], Response]
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            _authorize(served, request)
        except ApiError as error:
            return _error(error)
        return handler(request)

    return endpoint


def build_app(served: Served) -> Starlette:
    """The ASGI application serving ``served``."""

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": served.created, "owned_by": "clover-agent",
                "max_model_len": served.context_window}  # fmt: skip

    def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [card(name) for name in served.names]})

    def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in served.names:
            return _error(
                ApiError(404, f"the model {name!r} is not served here", param="model", code="model_not_found")
            )
        return JSONResponse(card(name))

    def metrics(_: Request) -> Response:
        text = served.metrics.render(served.batch.stats(), draining=served.draining)
        return PlainTextResponse(text, headers={"Content-Type": CONTENT_TYPE})

    async def health(_: Request) -> Response:
        if served.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ready"})  # no key asked: nothing about the checkpoint

    async def not_found(request: Request, _: Exception) -> Response:
        return _error(ApiError(404, f"no such endpoint: {request.method} {request.url.path}"))

    async def not_allowed(request: Request, _: Exception) -> Response:
        return _error(ApiError(405, f"{request.method} is not allowed on {request.url.path}"))

    routes = [
        Route("/v1/chat/completions", chat_completions(served), methods=["POST"]),
        Route("/v1/models", _guarded(served, models), methods=["GET"]),
        Route("/v1/models/{name:path}", _guarded(served, model), methods=["GET"]),
        Route("/metrics", _guarded(served, metrics), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_allowed},
        middleware=[Middleware(LoopbackHostOnly, served=served)],
    )
