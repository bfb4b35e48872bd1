"""The ``openai`` backend: any OpenAI-compatible chat-completions server (e.g. SGLang serving Clover).

POST ``{base_url}/chat/completions`` with the messages and the tools, streamed (server-sent events)
or not. Tool calls the server returns as structured ``tool_calls`` are used as they are (validated
against the tools' schemas); a server that returns none (no tool parser configured) gets its text
parsed with the Qwen3.6 protocol. ``reasoning_content`` is taken when the server splits reasoning
out, else ``<think>`` is split from the text.

This module is the chat-completions protocol (the request body, retries, assembling the answer);
:mod:`clover_agent.backends.http_client` is the HTTP and server-sent-events side.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
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
from clover_agent.backends.http_client import (
    HangUp,
    JsonPostClient,
    StatusError,
    describe_error,
    error_detail,
)
from clover_agent.backends.threads import run_in_daemon_thread
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

#: The model name sent when none is given (the CI Action's default too).
DEFAULT_MODEL_NAME = "clover"


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
            raise StatusError(200, describe_error(chunk["error"]))
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
            raise StatusError(200, f"the answer has no choices: {json.dumps(response)[:300]}")
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
        model_name: str = DEFAULT_MODEL_NAME,
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
        self.model_name = model_name
        self.api_key = api_key  # from the settings (CLOVER_API_KEY, OPENAI_API_KEY); None: no key
        self.stream = stream
        self.retries = retries
        self.retry_delay = retry_delay
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.name = f"openai:{model_name}@{parts.netloc}"
        self.client = JsonPostClient(self.url, timeout=timeout, connect_timeout=connect_timeout)

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

    def _status_message(self, error: StatusError) -> str:
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

    async def check(self) -> None:
        """Before any work: that the server answers and, where it lists its models (``GET /models``,
        as OpenAI-compatible servers do), that it serves ``model_name`` and takes the API key. A
        server without the list is only reached."""
        headers = {k: v for k, v in self._headers().items() if k == "Authorization"}
        path = f"{urlsplit(self.base_url).path}/models"
        status, body = await run_in_daemon_thread(
            functools.partial(self.client.get, path, headers), name="clover-openai-check"
        )
        if status in (401, 403):
            raise BackendUnavailable(self._status_message(StatusError(status, error_detail(body))))
        served = _served_models(body) if status == 200 else []
        if served and self.model_name not in served:
            shown = ", ".join(repr(m) for m in served[:10]) + (
                f" and {len(served) - 10} more" if len(served) > 10 else ""
            )
            raise BackendUnavailable(
                f"The model server at {self.base_url} does not serve the model {self.model_name!r}; it "
                f"serves {shown}.\nChoose one with --model-name."
            )

    # -- completion ----------------------------------------------------------------------------------

    async def _read_stream(
        self,
        payload: bytes,
        accumulator: ChatCompletionAccumulator,
        on_event: EventCallback | None,
        hang_up: HangUp,
    ) -> None:
        received: list[str] = []
        async for item in self.client.events(payload, self._headers(), hang_up):
            received.append(item)
            try:
                chunk = json.loads(item)
            except ValueError:
                raise StatusError(200, f"a streamed event is not JSON: {item[:300]!r}") from None
            if isinstance(chunk, dict):
                accumulator.add_chunk(chunk, on_event)
        if not accumulator.has_choice:  # not an empty answer: no answer at all
            last = f"; the last: {received[-1][:300]}" if received else ""
            raise StatusError(200, f"the streamed answer has no choices ({len(received)} event(s){last})")

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
            hang_up = HangUp()
            try:
                if self.stream:
                    await self._read_stream(payload, accumulator, on_event, hang_up)
                else:
                    accumulator.add_message(await self.client.post(payload, self._headers(), hang_up))
                break
            except StatusError as error:
                if error.status not in RETRYABLE_STATUSES or attempt >= self.retries:
                    raise BackendUnavailable(self._status_message(error)) from None
            finally:
                hang_up()  # done, failed or cancelled: the connection is not needed any more
            await asyncio.sleep(self.retry_delay * 2**attempt)
            attempt += 1
        return accumulator.turn(tools, lambda: self.count_tokens(messages, tools))


def _served_models(body: bytes) -> list[str]:
    """The model ids of a ``GET /models`` answer (``{"data": [{"id": ...}]}``); [] when it is not one."""
    try:
        listed = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(listed, list):
        return []
    return [str(m["id"]) for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]


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
