"""The openai backend against a real HTTP server started in the test (127.0.0.1, a free port) that
speaks chat completions: streamed and whole answers, with and without structured tool calls, error
statuses, a server that stops answering, and a port nobody listens on."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from clover_agent.backends import BackendEvent, BackendUnavailable, create_backend
from clover_agent.backends.http_client import iter_sse_data
from clover_agent.backends.openai import OpenAIBackend
from clover_agent.errors import ExitCode, UsageError
from clover_agent.protocol import ToolCall
from tests.clover_agent.tool_specs import SHELL_AND_FINISH

TOOLS = SHELL_AND_FINISH
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Run the tests."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [ToolCall("shell", {"command": "ls"}, id="call_1").to_message()],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "tests"},
]


class ChatServer:
    """A chat-completions server answering each POST with the next scripted reply:
    ``{"status": int, "json": obj}``, ``{"sse": [chunk, ...]}`` (dicts as JSON, strings as written;
    ``"pause": seconds`` between chunks makes a slow model; a client hanging up ends the stream)
    or ``{"hang": seconds}``, or ``{"until_hung_up": seconds}`` (answer nothing; set ``hung_up`` when
    the client closes the connection). Every request is recorded with its headers. ``host``: the
    address it listens on (a container's way to this machine, for tests whose client runs in one)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.replies: deque[dict[str, Any]] = deque()
        #: ``GET /v1/models`` answers ``{"data": [{"id": ...}]}`` with these; None: 404 (no list).
        self.models: list[str] | None = None
        self.models_status = 200
        self.requests: list[dict[str, Any]] = []
        self.hung_up = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": None})
                listed = server.models
                status = 404 if listed is None else server.models_status
                payload = json.dumps(
                    {"object": "list", "data": [{"id": m, "object": "model"} for m in listed or []]}
                )
                if status != 200:
                    payload = json.dumps(
                        {"error": {"message": f"HTTP {status} here", "type": "invalid_request_error"}}
                    )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                reply = server.replies.popleft()
                if "hang" in reply:
                    time.sleep(reply["hang"])
                    return
                if "until_hung_up" in reply:
                    self.connection.settimeout(reply["until_hung_up"])
                    try:
                        closed = self.connection.recv(1) == b""
                    except ConnectionResetError:
                        closed = True
                    except TimeoutError:
                        closed = False
                    if closed:
                        server.hung_up.set()
                    self.close_connection = True
                    return
                if "sse" in reply:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for event in reply["sse"]:
                        data = event if isinstance(event, str) else json.dumps(event)
                        try:
                            self.wfile.write(f"data: {data}\n\n".encode())
                            self.wfile.flush()
                        except (BrokenPipeError, ConnectionResetError):
                            server.hung_up.set()
                            break
                        time.sleep(reply.get("pause", 0))
                    self.close_connection = True
                    return
                payload = json.dumps(reply["json"]).encode()
                self.send_response(reply.get("status", 200))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://{host}:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    yield chat
    chat.close()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _message_reply(
    message: dict[str, Any], finish: str = "stop", usage: dict[str, int] | None = None
) -> dict:
    body: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = usage
    return {"json": body}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_whole_answer_with_structured_tool_calls(server: ChatServer) -> None:
    server.replies.append(
        _message_reply(
            {
                "role": "assistant",
                "content": "Running the suite.",
                "reasoning_content": "Tests first.",
                "tool_calls": [
                    {
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command": "pytest -q", "timeout": 60}'},
                    }
                ],
            },
            finish="tool_calls",
            usage={"prompt_tokens": 321, "completion_tokens": 17, "total_tokens": 338},
        )
    )
    backend = create_backend(
        "openai", base_url=server.base_url, model_name="clover", stream=False, api_key="secret-key"
    )
    assert backend.name == f"openai:clover@{server.base_url.split('//')[1].removesuffix('/v1')}"
    turn = await backend.complete(MESSAGES, TOOLS)

    assert (turn.content, turn.reasoning, turn.finish_reason) == (
        "Running the suite.",
        "Tests first.",
        "tool_calls",
    )
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_9", "shell", {"command": "pytest -q", "timeout": 60})
    ]
    assert (turn.prompt_tokens, turn.completion_tokens) == (321, 17)
    assert turn.raw == (
        "<think>\nTests first.\n</think>\n\nRunning the suite.\n\n<tool_call>\n<function=shell>\n<parameter=command>\n"
        "pytest -q\n</parameter>\n<parameter=timeout>\n60\n</parameter>\n</function>\n</tool_call>"
    )

    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer secret-key"
    body = request["body"]
    assert (body["model"], body["stream"], body["tools"]) == ("clover", False, TOOLS)
    history_call = body["messages"][2]["tool_calls"][0]
    assert history_call["function"] == {
        "name": "shell",
        "arguments": '{"command": "ls"}',
    }  # a JSON string for the API
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "tests"}


async def test_whole_answer_without_structured_calls_is_parsed_from_text(server: ChatServer) -> None:
    text = (
        "<think>\nNeed a listing.\n</think>\n\nLooking.\n<tool_call>\n<function=shell>\n<parameter=command>\nls -la\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    server.replies.append(_message_reply({"role": "assistant", "content": text}))
    backend = OpenAIBackend(server.base_url, stream=False, api_key="")
    turn = await backend.complete(MESSAGES, TOOLS)
    assert (turn.reasoning, turn.content) == ("Need a listing.", "Looking.")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("shell", {"command": "ls -la"})]
    assert turn.raw == text
    assert turn.prompt_tokens == backend.count_tokens(MESSAGES, TOOLS) > 0  # no usage: estimated
    assert "Authorization" not in server.requests[0]["headers"]


async def test_streamed_tool_call_deltas_are_merged_by_index(server: ChatServer) -> None:
    server.replies.append(
        {
            "sse": [
                _chunk({"role": "assistant", "reasoning_content": "Two "}),
                _chunk({"reasoning_content": "calls."}),
                _chunk({"content": "On it"}),
                _chunk({"content": "."}),
                _chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "shell", "arguments": ""},
                            }
                        ]
                    }
                ),
                _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"comm'}}]}),
                _chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "finish", "arguments": '{"summary"'},
                            }
                        ]
                    }
                ),
                _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'and": "make test"}'}}]}),
                _chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': "done"}'}}]}),
                _chunk({}, finish="tool_calls"),
                {
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 12},
                },
                "[DONE]",
            ]
        }
    )
    backend = OpenAIBackend(server.base_url)
    events: list[BackendEvent] = []
    turn = await backend.complete(MESSAGES, TOOLS, on_event=events.append)
    assert [(e.kind, e.text) for e in events] == [
        ("reasoning", "Two "),
        ("reasoning", "calls."),
        ("text", "On it"),
        ("text", "."),
    ]
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_a", "shell", {"command": "make test"}),
        ("call_b", "finish", {"summary": "done"}),
    ]
    assert (turn.content, turn.reasoning, turn.finish_reason) == ("On it.", "Two calls.", "tool_calls")
    assert (turn.prompt_tokens, turn.completion_tokens) == (40, 12)
    body = server.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.requests[0]["headers"]["Accept"] == "text/event-stream"


async def test_streamed_text_with_a_qwen_call_is_parsed(server: ChatServer) -> None:
    text = "Done.\n<tool_call>\n<function=finish>\n<parameter=summary>\nfixed the bug\n</parameter>\n</function>\n</tool_call>"
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    server.replies.append(
        {"sse": [_chunk({"content": p}) for p in pieces] + [_chunk({}, finish="stop"), "[DONE]"]}
    )
    events: list[BackendEvent] = []
    turn = await OpenAIBackend(server.base_url).complete(MESSAGES, TOOLS, on_event=events.append)
    assert "".join(e.text for e in events if e.kind == "text") == text
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("finish", {"summary": "fixed the bug"})]
    assert (turn.content, turn.finish_reason) == ("Done.", "tool_calls")


async def test_a_length_cut_is_reported(server: ChatServer) -> None:
    server.replies.append({"sse": [_chunk({"content": "I will now"}), _chunk({}, finish="length"), "[DONE]"]})
    turn = await OpenAIBackend(server.base_url).complete(MESSAGES, TOOLS)
    assert (turn.content, turn.finish_reason) == ("I will now", "length")


async def test_bad_structured_calls_become_a_format_error(server: ChatServer) -> None:
    server.replies.append(
        _message_reply(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "rm_rf", "arguments": "{}"}},
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command": '},
                    },
                    {
                        "id": "c3",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"timeout": 5}'},
                    },
                ],
            },
            finish="tool_calls",
        )
    )
    turn = await OpenAIBackend(server.base_url, stream=False).complete(MESSAGES, TOOLS)
    assert turn.tool_calls == []
    assert turn.format_error is not None
    assert "there is no tool named `rm_rf`; the available tools are: finish, shell" in turn.format_error
    assert "the arguments of `shell` are not valid JSON" in turn.format_error
    assert "invalid arguments for `shell`: 'command' is a required property" in turn.format_error
    assert "<function=rm_rf>" in turn.content  # the model sees the calls it made


async def test_error_status_is_retried_then_one_clear_error(server: ChatServer) -> None:
    for _ in range(3):
        server.replies.append({"status": 500, "json": {"error": {"message": "CUDA out of memory"}}})
    backend = OpenAIBackend(server.base_url, retries=2, retry_delay=0.01)
    with pytest.raises(BackendUnavailable) as info:
        await backend.complete(MESSAGES, TOOLS)
    assert info.value.exit_code == ExitCode.MODEL_UNAVAILABLE
    assert info.value.message.startswith(
        f"The model server at {server.base_url}/chat/completions answered HTTP 500: CUDA out of memory"
    )
    assert len(server.requests) == 3


async def test_a_passing_retry_succeeds(server: ChatServer) -> None:
    server.replies.append({"status": 503, "json": {"detail": "warming up"}})
    server.replies.append(_message_reply({"role": "assistant", "content": "Hello."}))
    turn = await OpenAIBackend(server.base_url, stream=False, retry_delay=0.01).complete(MESSAGES, TOOLS)
    assert turn.content == "Hello." and len(server.requests) == 2


async def test_unauthorised_is_not_retried_and_names_the_key(server: ChatServer) -> None:
    server.replies.append({"status": 401, "json": {"error": {"message": "invalid api key"}}})
    with pytest.raises(BackendUnavailable) as info:
        await OpenAIBackend(server.base_url, api_key="wrong").complete(MESSAGES, TOOLS)
    assert "HTTP 401: invalid api key" in info.value.message
    assert "CLOVER_API_KEY" in info.value.message
    assert len(server.requests) == 1


async def test_an_error_event_in_the_stream(server: ChatServer) -> None:
    server.replies.append(
        {"sse": [_chunk({"content": "Hi"}), {"error": {"message": "context length exceeded"}}]}
    )
    with pytest.raises(BackendUnavailable, match="answered an error: context length exceeded"):
        await OpenAIBackend(server.base_url, retry_delay=0.01).complete(MESSAGES, TOOLS)


@pytest.mark.parametrize("stream", [True, False])
async def test_unreachable_server_is_one_clear_error(stream: bool) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    backend = OpenAIBackend(url, stream=stream, retry_delay=0.01)
    with pytest.raises(BackendUnavailable) as info:
        await backend.complete(MESSAGES, TOOLS)
    message = info.value.message
    assert message.startswith(f"Cannot reach the model server at {url}/chat/completions: connection refused")
    assert "--base-url" in message and "CLOVER_BASE_URL" in message
    assert info.value.__cause__ is not None and isinstance(info.value.__cause__, ConnectionRefusedError)


async def test_a_server_that_stops_answering_times_out(server: ChatServer) -> None:
    server.replies.append({"hang": 600})
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"stopped answering: no data for 0\.3 s"):
        await OpenAIBackend(server.base_url, timeout=0.3).complete(MESSAGES, TOOLS)
    assert time.monotonic() - started < 120  # the read timeout, not the server's 600 s


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_cancelling_a_call_hangs_up_on_the_server(server: ChatServer, stream: bool) -> None:
    """An interrupted agent must not leave the server generating: cancelling the call closes the
    connection at once, even while the answer has not started."""
    server.replies.append({"until_hung_up": 120})
    task = asyncio.create_task(OpenAIBackend(server.base_url, stream=stream).complete(MESSAGES, TOOLS))
    while not server.requests:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.hung_up.wait, 120)


def test_base_url_must_be_http() -> None:
    with pytest.raises(UsageError, match="--base-url must be an http"):
        OpenAIBackend("localhost:30000")


def test_sse_framing() -> None:
    lines = [
        b": keep-alive\n",
        b"event: message\n",
        b'data: {"a":\n',
        b"data: 1}\n",
        b"\n",
        b"data:[DONE]\r\n",
        b"\r\n",
    ]
    assert list(iter_sse_data(iter(lines))) == ['{"a":\n1}', "[DONE]"]


async def test_an_answer_that_is_not_a_chat_completion(server: ChatServer) -> None:
    server.replies.append({"json": {"object": "list", "data": []}})
    with pytest.raises(BackendUnavailable, match="answered an error: the answer has no choices"):
        await OpenAIBackend(server.base_url, stream=False).complete(MESSAGES, TOOLS)


async def test_a_stream_without_choices_is_a_server_error(server: ChatServer) -> None:
    """Events whose ``choices`` are all empty carry no answer: a clear error naming the server,
    not an empty turn (which the agent would take for a model that is stuck)."""
    usage_only = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 9}}
    server.replies.append({"sse": [{"object": "chat.completion.chunk", "choices": []}, usage_only, "[DONE]"]})
    with pytest.raises(BackendUnavailable) as info:
        await OpenAIBackend(server.base_url, retry_delay=0.01).complete(MESSAGES, TOOLS)
    message = info.value.message
    assert message.startswith(f"The model server at {server.base_url}/chat/completions answered an error")
    assert "the streamed answer has no choices (2 event(s); the last: " in message
    assert '"prompt_tokens": 9' in message and "Check the server's log" in message
    assert len(server.requests) == 1  # not retried: the server answered, wrongly


async def test_odd_shapes_are_read_leniently(server: ChatServer) -> None:
    """Arguments sent as an object, a null delta and a non-dict choice do not break the stream."""
    server.replies.append(
        {
            "sse": [
                {"choices": ["junk", {"index": 0, "delta": None}]},
                _chunk(
                    {
                        "tool_calls": [
                            {"index": 0, "function": {"name": "finish", "arguments": {"summary": "ok"}}}
                        ]
                    }
                ),
                _chunk({}, finish="tool_calls"),
                "[DONE]",
            ]
        }
    )
    turn = await OpenAIBackend(server.base_url).complete(MESSAGES, TOOLS)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("finish", {"summary": "ok"})]
    assert turn.tool_calls[0].id.startswith("call_")


async def test_check_finds_a_model_the_server_does_not_serve(server: ChatServer) -> None:
    server.models = ["clover", "qwen3.6"]
    await OpenAIBackend(server.base_url, model_name="clover").check()
    with pytest.raises(BackendUnavailable) as found:
        await OpenAIBackend(server.base_url, model_name="gpt-4o").check()
    said = found.value.message
    assert (
        "does not serve the model 'gpt-4o'" in said
        and "'clover', 'qwen3.6'" in said
        and "--model-name" in said
    )
    assert OpenAIBackend(server.base_url).model_name == "clover"  # the Action's default, when none is given
    assert [r["path"] for r in server.requests] == ["/v1/models", "/v1/models"]
    assert not server.replies  # nothing was asked of the model


async def test_check_says_a_refused_key_and_passes_a_server_without_a_list(server: ChatServer) -> None:
    server.models = None  # no /models: reaching it is all that can be checked
    await OpenAIBackend(server.base_url, model_name="anything").check()
    server.models, server.models_status = ["clover"], 401
    with pytest.raises(BackendUnavailable) as found:
        await OpenAIBackend(server.base_url, api_key="sk-wrong").check()
    assert "HTTP 401" in found.value.message
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-wrong"
