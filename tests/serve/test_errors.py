"""Errors reach the official client in OpenAI's shape with the status it acts on: a bad request,
too long a prompt, a missing or wrong key, an unknown model, a full queue (429 with Retry-After)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from clover_agent.serve.app import BODY_TIMEOUT_S, MAX_BODY_BYTES, Served
from clover_agent.serve.server import serving_in_thread
from tests.serve.servers import DEADLINE_S, http, root, served_model, wait_for_stats

pytestmark = pytest.mark.slow

KEY = "sk-test-0123456789"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def keyed(real_vocab_checkpoint: Path) -> Iterator[tuple[Served, str]]:
    served = served_model(real_vocab_checkpoint, api_key=KEY, max_running=1, max_queued=0)
    with serving_in_thread(served) as base_url:
        yield served, base_url


def _client(base_url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def test_a_wrong_or_missing_key_is_401(keyed: tuple[Served, str]) -> None:
    served, base_url = keyed
    with pytest.raises(openai.AuthenticationError) as wrong:
        _client(base_url, "sk-test-0123456780").chat.completions.create(model="clover", messages=USER)
    assert wrong.value.status_code == 401
    assert wrong.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(base_url, "sk-test").models.list()
    for path in ("/v1/models", "/metrics"):
        response = http("GET", root(base_url) + path)
        assert response.status == 401 and response.json()["error"]["type"] == "authentication_error"
    # the health check needs no key (load balancers probe it), so it tells nothing else
    health = http("GET", root(base_url) + "/health")
    assert health.json() == {"status": "ready"}
    assert served.backend.model_dir.name not in health.text
    assert next(m.id for m in _client(base_url).models.list()) == "clover"


def test_a_blank_key_is_never_served_and_the_key_stays_out_of_reprs(keyed: tuple[Served, str]) -> None:
    served, _ = keyed
    for blank in ("", " \t"):
        with pytest.raises(ValueError, match="empty or blank"):
            Served(served.backend, served.batch, api_key=blank)
    assert KEY not in repr(served)


def test_bad_requests_are_400_naming_the_field(keyed: tuple[Served, str]) -> None:
    client = _client(keyed[1])
    cases = [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "shell", "arguments": "{not json"}}]}]},
            "messages[0].tool_calls[0]",
        ),
    ]  # fmt: skip
    for body, param in cases:
        request = {"model": "clover", "messages": USER, **body}
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(**request)
        assert error.value.status_code == 400
        assert error.value.param == param, body
        assert isinstance(error.value.body, dict) and error.value.body.get("message")
    # A value only the engine can judge: its own message comes back.
    with pytest.raises(openai.BadRequestError) as engine_side:
        client.chat.completions.create(model="clover", messages=USER, extra_body={"threshold": 1.5})
    assert "threshold must be in (0, 1]" in engine_side.value.message
    raw = http("POST", keyed[1] + "/chat/completions", b"{nope", key=KEY)
    assert raw.status == 400 and raw.json()["error"]["type"] == "invalid_request_error"


def test_hostile_bodies_are_400_in_openai_shape_and_counted(keyed: tuple[Served, str]) -> None:
    """Bodies that once reached the server's generic 500 (an exception out of the route): an
    integer past a float where a number goes, JSON nested past Python's recursion, a tool schema
    nested past the chat template's."""
    served, base_url = keyed
    deep_schema = '{"type": "object", "properties": {"a": ' * 900 + "{}" + "}}" * 900
    bodies = [
        b'{"model": "clover", "messages": [{"role": "user", "content": "hi"}], "temperature": 1' + b"0" * 400 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "clover", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
        b'"function": {"name": "x", "parameters": ' + deep_schema.encode() + b"}}]}",
    ]  # fmt: skip
    before = served.metrics.outcomes["rejected"]
    for body in bodies:
        reply = http("POST", base_url + "/chat/completions", body, key=KEY)
        assert reply.status == 400, reply.text[:200]
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert served.metrics.outcomes["rejected"] == before + len(bodies)


def test_text_that_is_not_unicode_is_400_and_the_server_goes_on(keyed: tuple[Served, str]) -> None:
    """A lone surrogate (a JSON escape like \\ud800, which no UTF-8 can write) in a message or a
    tool reached the tokenizer, whose TypeError was the generic 500 in plain text."""
    base_url = keyed[1]
    bodies = [
        b'{"model": "clover", "messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 4}',
        b'{"model": "clover", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, '
        b'"tools": [{"type": "function", "function": {"name": "x", "description": "\\udfff"}}]}',
    ]
    for body in bodies:
        reply = http("POST", base_url + "/chat/completions", body, key=KEY)
        assert reply.status == 400, reply.text[:200]
        error = reply.json()["error"]
        assert error["param"] == "messages" and "surrogate" in error["message"]
    assert _client(base_url).chat.completions.create(model="clover", messages=USER, max_tokens=4).choices


def test_steering_strengths_past_float32_are_400(keyed: tuple[Served, str]) -> None:
    """A bias strength float32 turns into inf made every probability NaN: the request failed in
    decoding (500, counted as an engine failure) instead of being refused."""
    served, base_url = keyed
    thinking = {"chat_template_kwargs": {"enable_thinking": True}, "temperature": 1.0}
    cases = [
        ({**thinking, "thinking_budget": 4, "thinking_ramp_strength": 1e308}, "thinking_ramp_strength"),
        ({"temperature": 1.0, "end_bias_start": 0.0, "end_bias_strength": 1e308}, "end_bias_strength"),
    ]
    failed = served.batch.stats().failed
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as error:
            _client(base_url).chat.completions.create(
                model="clover", messages=USER, max_tokens=8, extra_body=extra
            )
        assert error.value.param == param
    assert served.batch.stats().failed == failed


def _raw_post(base_url: str, framing: str) -> socket.socket:
    """A connection to the server that has sent a chat request's head, its body framed by the
    ``framing`` header, and none of the body: the test sends what it wants."""
    host, port = base_url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
    connection.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n".encode()
    )
    return connection


def test_a_chunked_body_past_the_limit_is_413_before_it_ends(keyed: tuple[Served, str]) -> None:
    """A body without a length is counted as it comes: the server answers once the limit is
    passed, with the client still sending (it would otherwise hold every byte sent until the end)."""
    served, base_url = keyed
    served.max_body_bytes = 4096
    try:
        with _raw_post(base_url, "Transfer-Encoding: chunked") as connection:
            piece = b"x" * 1024
            for _ in range(8):  # twice the limit, and never the last chunk
                connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            answer = ""
            while not answer.endswith("}}"):  # the whole error body
                received = connection.recv(65536)
                assert received, answer
                answer += received.decode(errors="replace")
        declared = http("POST", base_url + "/chat/completions", b" " * 8192, key=KEY)  # a length told
    finally:
        served.max_body_bytes = MAX_BODY_BYTES
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert '"type":"invalid_request_error"' in answer and "larger than 4096 bytes" in answer
    assert declared.status == 413 and declared.json()["error"]["code"] == "body_too_large"


def test_a_body_that_stops_arriving_is_408_and_its_connection_closed(keyed: tuple[Served, str]) -> None:
    """A client that declares a body and sends only part of it (or trickles it) cannot hold a
    connection and its request forever: past ``body_timeout_s`` it is 408 and the server lets go."""
    served, base_url = keyed
    served.body_timeout_s = 1.0
    try:
        with _raw_post(base_url, "Content-Length: 1000") as connection:
            connection.sendall(b'{"model": "clover", ')  # and nothing more
            answer = b""
            while received := connection.recv(65536):  # until the server closes the connection
                answer += received
    finally:
        served.body_timeout_s = BODY_TIMEOUT_S
    text = answer.decode(errors="replace")
    assert text.startswith("HTTP/1.1 408"), text[:200]
    assert '"code":"request_timeout"' in text and "within 1 s" in text


def test_sampling_values_at_the_edges_of_their_ranges_decode(real_vocab_checkpoint: Path) -> None:
    """The ends of :data:`SAFE_RANGES` decode without the NaN failures just past them (which
    failed the request in decoding, 500, counted and logged as an engine failure)."""
    from clover_agent.serve.request import SAFE_RANGES

    served = served_model(real_vocab_checkpoint, max_running=8)
    edges = [{name: bounds[0], "temperature": 1.0} for name, bounds in SAFE_RANGES.items()]
    edges += [{name: bounds[1], "temperature": 1.0} for name, bounds in SAFE_RANGES.items()]
    edges += [{"temperature": 1e-6}, {"temperature": 100.0}]
    for edge in edges:
        if "loop_penalty" in edge:
            edge["loop_action"] = "penalize"
        if "thinking_ramp_strength" in edge:  # the ramp applies under a thinking budget
            edge.update(thinking_budget=8, chat_template_kwargs={"enable_thinking": True})
        if "end_bias_strength" in edge:
            edge["end_bias_start"] = 0.0
    with serving_in_thread(served) as base_url:
        results: dict[int, str | None] = {}

        def ask(i: int, edge: dict) -> None:
            answer = _client(base_url).chat.completions.create(
                model="clover", messages=USER, max_tokens=16, extra_body=edge
            )
            results[i] = answer.choices[0].finish_reason

        threads = [threading.Thread(target=ask, args=(i, e)) for i, e in enumerate(edges)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE_S * 2)
        assert served.batch.stats().failed == 0
    assert len(results) == len(edges) and set(results.values()) <= {"stop", "length"}, results


def test_too_long_a_prompt_is_context_length_exceeded(keyed: tuple[Served, str]) -> None:
    served, base_url = keyed
    words = "lorem " * (served.context_window + 10)
    with pytest.raises(openai.BadRequestError) as error:
        _client(base_url).chat.completions.create(
            model="clover", messages=[{"role": "user", "content": words}]
        )
    assert error.value.code == "context_length_exceeded"
    assert f"context window is {served.context_window} tokens" in error.value.message


def test_a_prompt_longer_in_characters_than_the_window_holds_is_refused_before_tokenizing(
    keyed: tuple[Served, str],
) -> None:
    """More characters than the window's tokens can write (each at most the longest token's) is
    refused unread: tokenising 30 MB took 27 s of CPU here to say the same."""
    served, base_url = keyed
    most = served.context_window * served.backend.tokenizer.longest_token_chars
    with pytest.raises(openai.BadRequestError) as error:
        _client(base_url).chat.completions.create(
            model="clover", messages=[{"role": "user", "content": "x" * most}]
        )
    assert error.value.code == "context_length_exceeded" and error.value.param == "messages"
    assert "characters" in error.value.message and f"{served.context_window} tokens" in error.value.message


def test_an_unknown_model_is_404(keyed: tuple[Served, str]) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        _client(keyed[1]).chat.completions.create(model="gpt-4o", messages=USER)
    assert error.value.code == "model_not_found" and "clover" in error.value.message


def test_a_full_queue_is_429_with_retry_after(keyed: tuple[Served, str]) -> None:
    """One request runs (max_running=1, max_queued=0); the next is refused until it ends."""
    served, base_url = keyed
    before = served.batch.stats()
    stream = _client(base_url).chat.completions.create(
        model="clover", messages=USER, max_tokens=4000, stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    wait_for_stats(served, lambda s: s.running == 1, "the long request to run")
    with pytest.raises(openai.RateLimitError) as error:
        _client(base_url).chat.completions.create(model="clover", messages=USER, max_tokens=4)
    assert error.value.status_code == 429
    assert int(error.value.response.headers["retry-after"]) >= 1
    stream.close()  # the client goes away: its request is cancelled, and the slot is free again
    wait_for_stats(served, lambda s: s.cancelled > before.cancelled and s.running == 0, "the cancel")
    answer = _client(base_url).chat.completions.create(model="clover", messages=USER, max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length")
    metrics = http("GET", root(base_url) + "/metrics", key=KEY).text
    assert 'clover_requests_total{outcome="overloaded"} 1' in metrics.splitlines()


def test_a_client_that_goes_away_cancels_its_request_and_the_others_finish(
    real_vocab_checkpoint: Path,
) -> None:
    served = served_model(real_vocab_checkpoint, max_running=4)
    with serving_in_thread(served) as base_url:
        finished: list[str | None] = []

        def other() -> None:
            answer = _client(base_url).chat.completions.create(model="clover", messages=USER, max_tokens=48)
            finished.append(answer.choices[0].finish_reason)

        neighbour = threading.Thread(target=other)
        neighbour.start()
        # Streamed: the client reads a chunk and closes the connection.
        stream = _client(base_url).chat.completions.create(
            model="clover", messages=USER, max_tokens=4000, stream=True
        )
        next(iter(stream))
        stream.close()
        wait_for_stats(served, lambda s: s.cancelled == 1, "the streamed request's cancel")
        # Whole: the client gives up waiting (its timeout) and closes the connection.
        impatient = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="clover", messages=USER, max_tokens=4000)
        stats = wait_for_stats(
            served, lambda s: s.cancelled == 2 and s.running <= 1, "the whole request's cancel"
        )
        assert stats.failed == 0
        neighbour.join(300)
        assert finished and finished[0] in ("stop", "length")
        stats = wait_for_stats(served, lambda s: s.running == 0, "everything to end")
        assert (stats.cancelled, stats.failed) == (2, 0)
        assert stats.running_cache_bytes == 0
        metrics = http("GET", root(base_url) + "/metrics").text.splitlines()
        assert 'clover_requests_total{outcome="cancelled"} 2' in metrics
        assert "clover_running_requests 0" in metrics
