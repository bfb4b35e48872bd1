"""The official ``openai`` client, unmodified, against a real server on a tiny checkpoint with the
real vocabulary: whole and streamed answers, reasoning, tools offered, usage, stop strings and
Clover's own fields. The model is random, so answers are checked for shape and consistency."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from clover_agent.serve.app import Served, _params, _prompt_ids
from clover_agent.serve.request import read_chat_request
from clover_agent.serve.server import serving_in_thread
from tests.serve.servers import http, root, served_model, wait_for_stats

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Write a function that adds two numbers."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def server(real_vocab_checkpoint: Path) -> Iterator[tuple[Served, str]]:
    served = served_model(real_vocab_checkpoint)
    with serving_in_thread(served) as base_url:
        yield served, base_url


@pytest.fixture
def client(server: tuple[Served, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[1], api_key="unused", max_retries=0)


def test_a_whole_answer_has_openai_shape_and_usage(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="clover", messages=USER, max_tokens=24, temperature=0)
    choice = answer.choices[0]
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "clover"
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert answer.usage is not None
    assert 0 < answer.usage.completion_tokens <= 24
    assert answer.usage.prompt_tokens > 10  # the user's 9 tokens and the template's turn markers
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    # thinking is on by default: the prompt opened <think>, so what the model wrote first is reasoning
    assert getattr(choice.message, "reasoning_content", None)


def test_a_streamed_answer_is_chunks_then_usage_then_done(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert reasoning.strip()
    assert chunks[-1].usage.completion_tokens <= 40
    # several blocks of 32 tokens: the text came in more than one delta
    assert sum(1 for c in chunks if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)) >= 2


def test_without_stream_options_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="clover", messages=USER, max_tokens=8, stream=True))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason is not None


def test_thinking_off_and_a_thinking_budget(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=16, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert getattr(plain.choices[0].message, "reasoning_content", None) is None
    assert plain.choices[0].message.content
    # Clover's thinking budget (an extra field) forces </think> after 6 tokens: the rest is the answer.
    budgeted = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=48, temperature=0, extra_body={"thinking_budget": 6}
    )
    assert getattr(budgeted.choices[0].message, "reasoning_content", None)
    assert budgeted.choices[0].message.content


def test_the_folder_name_is_a_model_id_too(client: openai.OpenAI, real_vocab_checkpoint: Path) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == ["clover", real_vocab_checkpoint.name]
    assert client.models.retrieve(real_vocab_checkpoint.name).id == real_vocab_checkpoint.name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    answer = client.chat.completions.create(model=real_vocab_checkpoint.name, messages=USER, max_tokens=4)
    assert answer.model == real_vocab_checkpoint.name


def test_tools_offered_give_well_formed_calls_or_text(client: openai.OpenAI) -> None:
    """A random model rarely writes a call; whatever it writes comes back in OpenAI's shape (the
    parsing itself is tested with real model text in test_answer.py)."""
    conversation = [
        {"role": "system", "content": "You are a coding agent."},
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "main.py"},
    ]  # fmt: skip
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    bare = client.chat.completions.create(model="clover", messages=USER, max_tokens=1, extra_body=off)
    for stream in (False, True):
        answer = client.chat.completions.create(
            model="clover", messages=conversation, tools=TOOLS, max_tokens=32, stream=stream, extra_body=off,
            stream_options={"include_usage": True} if stream else openai.omit,
        )  # fmt: skip
        if stream:  # a call's arguments come in fragments, by the call's index
            chunks = list(answer)
            ends = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
            finish, used = ends[0].finish_reason, chunks[-1].usage
            joined: dict[int, str] = {}
            deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            for t in deltas:
                joined[t.index] = joined.get(t.index, "") + (
                    (t.function.arguments if t.function else None) or ""
                )
            arguments = [joined[i] for i in sorted(joined)]
        else:
            finish, used = answer.choices[0].finish_reason, answer.usage
            found = answer.choices[0].message.tool_calls or []
            arguments = [c.function.arguments for c in found if c.type == "function"]
        assert finish in ("stop", "length", "tool_calls")
        if finish == "tool_calls":
            assert arguments and all(isinstance(json.loads(a), dict) for a in arguments)
        elif arguments:  # a cut answer's calls come all the same; the last may never close
            assert finish == "length" or not arguments[-1].endswith("}")
            assert all(isinstance(json.loads(a), dict) for a in arguments[:-1])
        # the history (the call, its result) and the tools' descriptions went into the prompt
        assert used is not None and bare.usage is not None
        assert used.prompt_tokens > bare.usage.prompt_tokens + 40


def test_a_stop_string_cuts_the_answer(client: openai.OpenAI) -> None:
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    answer = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=64, temperature=0, stop=[" "], extra_body=off
    )
    text = answer.choices[0].message.content or ""
    assert answer.choices[0].finish_reason == "stop"  # this checkpoint writes a space within 64 tokens
    assert " " not in text
    streamed = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=64, temperature=0, stop=" ", stream=True, extra_body=off
    )
    chunks = list(streamed)
    assert " " not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_repeated_prefix_is_reported_as_cached(client: openai.OpenAI) -> None:
    long_system = {"role": "system", "content": "You are a careful engineer. " * 40}
    first = client.chat.completions.create(model="clover", messages=[long_system, *USER], max_tokens=4)
    again = client.chat.completions.create(model="clover", messages=[long_system, *USER], max_tokens=4)
    assert first.usage is not None and again.usage is not None
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert 0 < cached <= again.usage.prompt_tokens


def test_several_clients_at_once_all_finish(server: tuple[Served, str]) -> None:
    served, base_url = server
    # an earlier test's request may still be leaving the engine (a stop string's finish, a disconnect)
    before = wait_for_stats(served, lambda s: s.running == 0 and s.queued == 0, "an idle engine")
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": f"Question number {i}: what is {i} + {i}?"}]
        answer = c.chat.completions.create(
            model="clover", messages=messages, max_tokens=40, stream=i % 2 == 0
        )
        if i % 2 == 0:
            chunks = list(answer)  # type: ignore[arg-type]
            results[i] = next(
                c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
            )
        else:
            results[i] = answer.choices[0].finish_reason  # type: ignore[union-attr]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == list(range(6))
    assert set(results.values()) <= {"stop", "length"}
    # a request is counted just after its last event is handed out: wait for the engine to be idle
    after = wait_for_stats(served, lambda s: s.running == 0 and s.queued == 0, "an idle engine")
    assert after.finished - before.finished == 6
    assert after.cancelled == before.cancelled


def test_agents_with_the_same_tools_compute_the_tools_part_once(server: tuple[Served, str]) -> None:
    """Four agents of one product at once, each in its own repository: the same tools, their own
    system prompts and tasks. The template lays the tools out first; one request computes that part,
    the others start from its state (``cached_tokens``), whether they waited for it
    (``clover_held_for_shared_prefix_total``) or came after."""
    _, base_url = server
    tag = uuid.uuid4().hex  # in the tools: nothing of an earlier test's is reused
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} in the workspace ({tag}).",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
        for name in ("read_file", "write_file", "run_tests")
    ]
    cached: dict[int, int] = {}

    def ask(i: int) -> None:
        c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages = [
            {"role": "system", "content": f"Repository number {i}: Python; top level src/ tests/."},
            {"role": "user", "content": f"Task {i}: fix test {i}."},
        ]
        answer = c.chat.completions.create(model="clover", messages=messages, tools=tools, max_tokens=8)
        details = answer.usage.prompt_tokens_details  # type: ignore[union-attr]
        cached[i] = details.cached_tokens if details and details.cached_tokens else 0

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(cached) == [0, 1, 2, 3]
    reused = [n for n in cached.values() if n > 0]
    assert len(reused) >= 3 and len(set(reused)) == 1, cached  # all from the one tools-part state
    assert reused[0] % 32 == 0 and reused[0] >= 32
    text = http("GET", base_url.removesuffix("/v1") + "/metrics").text  # the counter is exposed
    assert "clover_held_for_shared_prefix_total" in text


def test_end_bias_and_ignore_eos_as_extra_fields(client: openai.OpenAI) -> None:
    """Clover's end-of-response bias, pushed to the limit, ends the answer at once; with
    ``ignore_eos`` the same answer runs to its length (what benchmarks ask for)."""
    steer = {
        "chat_template_kwargs": {"enable_thinking": False},
        "end_bias_start": 0.0,
        "end_bias_strength": 1e4,
    }
    ended = client.chat.completions.create(model="clover", messages=USER, max_tokens=40, extra_body=steer)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage is not None and ended.usage.completion_tokens < 40
    through = client.chat.completions.create(
        model="clover", messages=USER, max_tokens=40, extra_body={**steer, "ignore_eos": True}
    )
    assert through.choices[0].finish_reason == "length"
    assert through.usage is not None and through.usage.completion_tokens == 40


def test_a_stop_string_is_a_completion_counting_the_tokens_up_to_it(server: tuple[Served, str]) -> None:
    """The tokens of the text returned, through the stop string's end, are the completion tokens
    (whole and streamed alike); decoding past it is no part of the answer; the engine and
    ``/metrics`` both count the request completed, never cancelled."""
    served, base_url = server
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    ask = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
    body = {"model": "clover", "messages": USER, "max_tokens": 64, "temperature": 0}
    full = client.chat.completions.create(**body, extra_body=ask)  # type: ignore[call-overload]
    text = full.choices[0].message.content or ""
    assert full.usage is not None and full.usage.completion_tokens == 64
    # The same answer's token ids, from the engine itself (no stop string).
    chat = read_chat_request({**body, **ask})
    prompt_ids = _prompt_ids(served, chat, thinking=False)
    ids = served.batch.generate(prompt_ids, _params(served, chat, len(prompt_ids), thinking=False)).token_ids
    decode = served.backend.tokenizer.decode
    assert decode(ids) == text
    at = len(text) // 4
    stop = text[at : at + 3]
    through = text[: text.index(stop) + len(stop)]

    before, stats_before = served.metrics.outcomes["completed"], served.batch.stats()
    whole = client.chat.completions.create(**body, stop=[stop], extra_body=ask)  # type: ignore[call-overload]
    streamed = list(
        client.chat.completions.create(  # type: ignore[call-overload]
            **body, stop=[stop], extra_body=ask, stream=True, stream_options={"include_usage": True}
        )
    )
    assert whole.choices[0].finish_reason == "stop" and streamed[-2].choices[0].finish_reason == "stop"
    assert whole.choices[0].message.content == through[: -len(stop)]
    assert whole.usage is not None and streamed[-1].usage == whole.usage
    used = whole.usage.completion_tokens
    assert decode(ids[:used]).startswith(through) and not decode(ids[: used - 1]).startswith(through)
    assert used < 32  # the first block was decoded whole: its tokens past the stop string are not counted

    stats = wait_for_stats(served, lambda s: s.running == 0, "the stopped requests to leave the engine")
    assert served.metrics.outcomes["completed"] == before + 2
    assert (stats.finished - stats_before.finished, stats.cancelled - stats_before.cancelled) == (2, 0)
    metrics = http("GET", root(base_url) + "/metrics").text
    assert f'clover_engine_requests_total{{state="cancelled"}} {stats.cancelled}' in metrics
    assert f'clover_requests_total{{outcome="completed"}} {before + 2}' in metrics
