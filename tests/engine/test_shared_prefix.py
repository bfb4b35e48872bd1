"""Calls that start with the same first message (an agent's system prompt and tools) compute it once.

``DecodeCall.share_points`` are where a chat prompt's tools part and first message end, in whole
blocks; prefill keeps a snapshot at each, and ``BatchEngine`` holds back requests whose first point
another running request is computing, then starts them from its snapshot. Exactness: each call's greedy tokens equal
its decode alone from nothing cached (float64, as the other batching tests).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from clover_agent.engine.batching import BatchEngine, RequestCancelled
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.text.chat import bundled_chat_template, render_chat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "write_file", "run_tests")
]
SYSTEM = "You are a coding agent. Tools: read_file(path), edit_file(path, old, new), run_tests(selector)."


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("share") / "ckpt", peaked=True, seed=5)
    return Engine.from_pretrained(path, progress=None, dtype=torch.float64)


def chat(engine: Engine, system: str, task: str) -> list[int]:
    """A chat prompt as the template lays it out: the first message, then the user's, then the turn."""
    t = engine.tokenizer
    assert t is not None and t.im_start_id is not None and t.im_end_id is not None
    start, end, newline = t.im_start_id, t.im_end_id, t.encode("\n")

    def message(role: str, text: str) -> list[int]:
        return [start, *t.encode(f"{role}\n{text}"), end, *newline]

    return message("system", system) + message("user", task) + [start, *t.encode("assistant\n")]


def first_message_end(engine: Engine, prompt: list[int]) -> int:
    assert engine.tokenizer is not None and engine.tokenizer.im_end_id is not None
    return prompt.index(engine.tokenizer.im_end_id) + 1


def alone(engine: Engine, prompt: list[int], **params: Any) -> list[int]:
    engine.prefix_cache.clear()
    tokens = engine.generate(prompt, engine.default_params(**params)).token_ids
    engine.prefix_cache.clear()
    return tokens


def test_without_tools_the_share_point_is_the_end_of_the_first_message_in_whole_blocks(
    engine: Engine,
) -> None:
    prompt = chat(engine, SYSTEM, "fix the test")
    end = first_message_end(engine, prompt)
    block = engine.config.block_size
    batch = BatchEngine(engine, max_running=1)
    try:
        request = batch.submit(prompt, engine.default_params(max_new_tokens=1))
        assert request.share_at == end // block * block > 0
        assert request.call.share_points() == [request.share_at]  # no tools: one point
        plain = batch.submit([40 + i for i in range(90)], engine.default_params(max_new_tokens=1))
        assert plain.share_at == 0 and plain.share_key is None  # not a chat prompt: nothing shared
        request.result(timeout=120), plain.result(timeout=120)
    finally:
        batch.close()


def test_requests_sharing_a_first_message_compute_it_once_and_decode_as_alone(engine: Engine) -> None:
    tasks = [f"Task {i}: tests/test_calc.py fails in case {i * 37}; make it pass." for i in range(8)]
    prompts = [chat(engine, SYSTEM, task) for task in tasks]
    other = chat(engine, "You review patches; you never edit files.", "Review the patch.")
    modes: list[dict[str, Any]] = [
        {"max_new_tokens": 48},
        {"max_new_tokens": 40, "mode": "autoregressive"},
        {"max_new_tokens": 48, "mode": "self_speculative"},
    ]
    calls = [(p, modes[i % 3]) for i, p in enumerate(prompts)] + [(other, modes[0])]
    expected = [alone(engine, p, **kw) for p, kw in calls]
    share = first_message_end(engine, calls[0][0])
    assert share >= 2 * engine.config.block_size  # the first message spans whole blocks

    def run(max_running: int) -> tuple[list[list[int]], list[int], Any]:
        batch = BatchEngine(engine, max_running=max_running, prefill_chunk=64, prefix_cache=PrefixCache())
        try:
            requests = [batch.submit(p, engine.default_params(**kw)) for p, kw in calls]
            results = [r.result(timeout=300) for r in requests]
            return [r.token_ids for r in results], [r.reused_tokens for r in results], batch.stats()
        finally:
            assert batch.close(timeout=60)

    tokens, reused, stats = run(max_running=9)
    assert tokens == expected
    # One call per mode computed the system message; the others of that mode waited, then started
    # from its state; the call with another first message neither waited nor reused anything.
    shared = sum(1 for r in reused[:8] if r > 0)
    assert shared == 5 and stats.held_for_share == 5, (reused, stats)
    assert reused[8] == 0
    # Against computing it in every call: fewer tokens through the model.
    forwarded_shared = stats.tokens_forwarded
    engine.prefix_cache.clear()
    unshared = BatchEngine(engine, max_running=9, prefill_chunk=64, prefix_cache=PrefixCache(max_bytes=0))
    try:
        for r in [unshared.submit(p, engine.default_params(**kw)) for p, kw in calls]:
            r.result(timeout=300)
        forwarded_alone = unshared.stats().tokens_forwarded
    finally:
        assert unshared.close(timeout=60)
    assert forwarded_alone - forwarded_shared >= 5 * (
        share // engine.config.block_size * engine.config.block_size
    )


def test_a_cancelled_request_computing_the_first_message_hands_the_work_on(engine: Engine) -> None:
    prompts = [chat(engine, SYSTEM * 3, f"Task {i}: make tests/test_io.py pass.") for i in range(3)]
    expected = [alone(engine, p, max_new_tokens=40) for p in prompts[1:]]
    batch = BatchEngine(engine, max_running=4, prefill_chunk=32, prefix_cache=PrefixCache())
    try:
        first = batch.submit(prompts[0], engine.default_params(max_new_tokens=40))
        rest = [batch.submit(p, engine.default_params(max_new_tokens=40)) for p in prompts[1:]]
        first.cancel()  # before or while it computes the shared message
        with pytest.raises(RequestCancelled):
            first.result(timeout=120)
        assert [r.result(timeout=300).token_ids for r in rest] == expected
    finally:
        assert batch.close(timeout=60)


def test_a_first_message_the_cache_cannot_keep_holds_no_one_back_again(engine: Engine) -> None:
    """With no room in the prefix cache the shared state is not kept: the requests held for it start
    (computing it each), and later ones with the same message are not held at all (holding them
    would only make them compute it one after another)."""
    prompts = [chat(engine, SYSTEM, f"Task {i}: make tests/test_net.py pass.") for i in range(8)]
    expected = [alone(engine, p, max_new_tokens=32) for p in prompts]
    batch = BatchEngine(engine, max_running=8, prefill_chunk=32, prefix_cache=PrefixCache(max_bytes=0))
    try:
        first = [batch.submit(p, engine.default_params(max_new_tokens=32)) for p in prompts[:4]]
        assert [r.result(timeout=300).token_ids for r in first] == expected[:4]
        held = batch.stats().held_for_share
        assert held == 3  # the first wave waited once for the one computing it
        later = [batch.submit(p, engine.default_params(max_new_tokens=32)) for p in prompts[4:]]
        assert [r.result(timeout=300).token_ids for r in later] == expected[4:]
        assert batch.stats().held_for_share == held  # and no one waited since
        assert all(r.result().reused_tokens == 0 for r in first + later)
    finally:
        assert batch.close(timeout=60)


def rendered(engine: Engine, system: str, task: str) -> list[int]:
    """A prompt as serve renders it: the bundled Qwen3.6 template, with :data:`TOOLS`."""
    assert engine.tokenizer is not None
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    text = render_chat(
        bundled_chat_template(), messages, TOOLS, add_generation_prompt=True, enable_thinking=False
    )
    return engine.tokenizer.encode(text)


def test_agents_in_other_repositories_share_the_tools_part(engine: Engine) -> None:
    """The template lays the tools and the instructions for calling them out first, then the system
    prompt's own text (the repository's facts): agents in four repositories share the first part."""
    prompts = [
        rendered(engine, f"Repository {name}: Python, top level src/ tests/.", f"Fix the {name} test.")
        for name in ("alpha", "beta", "gamma", "delta")
    ]
    expected = [alone(engine, p, max_new_tokens=32) for p in prompts]
    batch = BatchEngine(engine, max_running=4, prefill_chunk=256, prefix_cache=PrefixCache())
    try:
        requests = [batch.submit(p, engine.default_params(max_new_tokens=32)) for p in prompts]
        results = [r.result(timeout=300) for r in requests]
        stats = batch.stats()
    finally:
        assert batch.close(timeout=60)
    tools_end, first_end = requests[0].call.share_points()
    assert tools_end < first_end and all(r.call.share_points()[0] == tools_end for r in requests)
    assert engine.tokenizer is not None
    text = engine.tokenizer.decode
    assert "</IMPORTANT>" in text(prompts[0][tools_end - 32 : tools_end + 32])  # the point is its block
    assert "Repository" not in text(prompts[0][:tools_end])  # and the repository's facts come after
    assert [r.token_ids for r in results] == expected
    assert sorted(r.reused_tokens for r in results) == [0, tools_end, tools_end, tools_end]
    assert stats.held_for_share == 3


def test_a_request_is_not_held_for_a_state_it_could_not_start_from(engine: Engine) -> None:
    """A diffusion call with ``causal_context`` computes the shared message with causal attention,
    one without it needs the block-causal state: they cannot share it, so neither waits for the other."""
    prompts = [chat(engine, SYSTEM * 3, f"Task {i}: make tests/test_db.py pass.") for i in range(2)]
    kinds: list[dict[str, Any]] = [{"max_new_tokens": 32, "causal_context": True}, {"max_new_tokens": 32}]
    expected = [alone(engine, p, **kw) for p, kw in zip(prompts, kinds, strict=True)]
    batch = BatchEngine(engine, max_running=4, prefill_chunk=32, prefix_cache=PrefixCache())
    try:
        requests = [
            batch.submit(p, engine.default_params(**kw)) for p, kw in zip(prompts, kinds, strict=True)
        ]
        assert [r.result(timeout=300).token_ids for r in requests] == expected
        assert batch.stats().held_for_share == 0 and not requests[1].held
    finally:
        assert batch.close(timeout=60)


def test_a_conversation_whose_later_state_is_cached_is_not_held_behind_a_new_one(engine: Engine) -> None:
    """The tools part's state was evicted (least recently used: the conversation's later states were
    used since); a new conversation computes it again. The next turn of the old conversation has its
    own state, past the tools part, in the cache: it starts from it at once instead of waiting."""
    first = rendered(engine, "Repository alpha: Python, top level src/ tests/.", "Fix the alpha test.")
    batch = BatchEngine(engine, max_running=4, prefill_chunk=32, prefix_cache=PrefixCache())
    try:
        turn = batch.submit(first, engine.default_params(max_new_tokens=16))
        answer = turn.result(timeout=300).token_ids
        tools_end = turn.call.share_points()[0]
        cache = batch.prefix_cache
        assert cache is not None
        for key in [k for k, e in cache._entries.items() if e.tokens.numel() == tools_end]:
            del cache._entries[key]  # as the LRU eviction does
        assert engine.tokenizer is not None
        turn_end = "<|im_end|>\n<|im_start|>user\nNow run the tests.<|im_end|>\n<|im_start|>assistant\n"
        again = first + answer + engine.tokenizer.encode(turn_end)
        fresh = rendered(engine, "Repository beta: Go, top level cmd/ pkg/.", "Fix the beta test.")
        newcomer = batch.submit(fresh, engine.default_params(max_new_tokens=16))
        second = batch.submit(again, engine.default_params(max_new_tokens=16))
        results = [newcomer.result(timeout=300), second.result(timeout=300)]
        assert not second.held and batch.stats().held_for_share == 0
        assert results[1].reused_tokens > tools_end  # its own state, past the tools part
    finally:
        assert batch.close(timeout=60)
    assert [r.token_ids for r in results] == [alone(engine, p, max_new_tokens=16) for p in (fresh, again)]


def test_a_request_waits_for_a_shared_state_once_however_many_give_it_up(engine: Engine) -> None:
    """A hostile client queues requests with the tools everyone uses ahead of another client's and
    cancels each while it computes the tools part: the other client's request waits for the first
    of them only, then computes the part itself, instead of waiting for each in turn."""
    assert engine.tokenizer is not None
    tools = [
        {**tool, "function": {**tool["function"], "name": f"{tool['function']['name']}_{i}"}}
        for i in range(10)
        for tool in TOOLS
    ]

    def prompt(system: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Fix the test."}]
        text = render_chat(bundled_chat_template(), messages, tools, add_generation_prompt=True)
        assert engine.tokenizer is not None
        return engine.tokenizer.encode(text)

    hostile = [prompt(f"Hostile {i}.") for i in range(2)]
    other = prompt("Repository alpha: Python, top level src/ tests/.")
    expected = alone(engine, other, max_new_tokens=16)
    batch = BatchEngine(engine, max_running=4, prefill_chunk=32, prefix_cache=PrefixCache())
    try:
        first, second = (batch.submit(p, engine.default_params(max_new_tokens=16)) for p in hostile)
        victim = batch.submit(other, engine.default_params(max_new_tokens=16))
        assert first.share_at == victim.share_at >= 20 * 32  # many steps of prefill to compute
        deadline = time.monotonic() + 120
        while not (victim.held and second.held) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert victim.held and first.cache is not None and first.cache.length < first.share_at
        first.cancel()  # while it computes the tools part: the second is next in the queue
        result = victim.result(timeout=300)
        second.cancel()
        assert result.token_ids == expected
        assert result.reused_tokens == 0  # it did not wait for the second: computed the part itself
    finally:
        assert batch.close(timeout=60)
