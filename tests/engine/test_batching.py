"""Batched decoding (``engine/batching.py``): many requests on one model at once, each getting the
tokens it would get alone.

The oracle is the same call decoded alone by ``Engine.generate`` from an empty prefix cache. The
models run in float64 so that a packed forward's different float rounding is far below any gap a
greedy choice or the LowConfidence threshold could fall into.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from clover_agent.engine.batching import (
    BatchEngine,
    EngineClosed,
    QueueFull,
    RequestCancelled,
)
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("batch") / "ckpt", peaked=True, seed=5)
    return Engine.from_pretrained(path, progress=None, dtype=torch.float64)


@pytest.fixture(scope="module")
def bidirectional_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_tiny_checkpoint(
        tmp_path_factory.mktemp("batch-bidir") / "ckpt", peaked=True, seed=7, bidirectional=True
    )
    return Engine.from_pretrained(path, progress=None, dtype=torch.float64)


def alone(engine: Engine, prompt: list[int], **params: Any) -> list[int]:
    """The call's tokens decoded by itself, from nothing cached."""
    engine.prefix_cache.clear()
    tokens = engine.generate(prompt, engine.default_params(**params)).token_ids
    engine.prefix_cache.clear()
    return tokens


def prompt(length: int, start: int = 40) -> list[int]:
    return [start + (i * 7) % 400 for i in range(length)]


#: Eight calls of different prompt lengths, modes and controls (the mixed batch).
MIXED: list[tuple[list[int], dict[str, Any]]] = [
    (prompt(5), {"max_new_tokens": 80}),
    (prompt(40, 50), {"max_new_tokens": 64, "mode": "autoregressive"}),
    (prompt(70, 60), {"max_new_tokens": 96, "mode": "self_speculative"}),
    (prompt(33, 70), {"max_new_tokens": 70, "repetition_penalty": 1.3, "presence_penalty": 0.5}),
    (prompt(64, 80), {"max_new_tokens": 96, "fuse_commit": True}),
    (prompt(150, 90), {"max_new_tokens": 64, "thinking": True, "thinking_budget": 40}),
    (prompt(12, 100), {"max_new_tokens": 90, "causal_context": True, "end_bias_start": 0.5}),
    (prompt(96, 110), {"max_new_tokens": 64, "frequency_penalty": 0.4, "loop_action": "stop"}),
]


def test_a_mixed_batch_with_late_arrivals_and_a_cancel_gives_each_call_its_tokens_alone(
    engine: Engine,
) -> None:
    expected = [alone(engine, p, **kw) for p, kw in MIXED]
    assert len({tuple(t) for t in expected}) == len(expected)  # the calls really differ
    batch = BatchEngine(engine, max_running=8, prefill_chunk=64)
    try:
        # Five start together; the rest arrive once the first has committed a block (mid-decode).
        first = [batch.submit(p, engine.default_params(**kw)) for p, kw in MIXED[:5]]
        victim = batch.submit(prompt(50, 120), engine.default_params(max_new_tokens=200))
        events = first[0].events(timeout=120)
        assert any(isinstance(event, BlockCommitted) for event in events)
        late = [batch.submit(p, engine.default_params(**kw)) for p, kw in MIXED[5:]]
        for event in victim.events(timeout=120):  # cancel it once it is under way
            if isinstance(event, BlockCommitted):
                victim.cancel()
                break
        results = [request.result(timeout=300) for request in first + late]
        with pytest.raises(RequestCancelled):
            victim.result(timeout=60)
        stats = batch.stats()
    finally:
        assert batch.close(timeout=60)
    for (_, kw), result, want in zip(MIXED, results, expected, strict=True):
        assert result.token_ids == want, kw
    assert stats.cancelled == 1 and stats.finished == len(MIXED) and stats.failed == 0
    # Requests really shared steps (more than one forward per packed step on average).
    assert stats.forwards_per_step > 1.5, stats


def test_one_request_alone_in_the_batch_engine_matches_generate_in_every_mode(engine: Engine) -> None:
    batch = BatchEngine(engine, max_running=2)
    try:
        for mode in ("diffusion", "self_speculative", "autoregressive"):
            params = {"max_new_tokens": 48, "mode": mode}
            want = alone(engine, prompt(45), **params)
            engine.prefix_cache.clear()
            assert batch.generate(prompt(45), engine.default_params(**params)).token_ids == want, mode
    finally:
        batch.close()


def test_a_bidirectional_checkpoint_batches_exactly(bidirectional_engine: Engine) -> None:
    engine = bidirectional_engine
    calls = [(prompt(n, 30 + n), {"max_new_tokens": 64}) for n in (3, 31, 32, 65)]
    calls.append((prompt(20), {"max_new_tokens": 64, "fuse_commit": True, "causal_context": True}))
    expected = [alone(engine, p, **kw) for p, kw in calls]
    batch = BatchEngine(engine, max_running=8)
    try:
        requests = [batch.submit(p, engine.default_params(**kw)) for p, kw in calls]
        got = [request.result(timeout=300).token_ids for request in requests]
    finally:
        batch.close()
    assert got == expected


def test_sampled_calls_are_reproducible_per_seed(engine: Engine) -> None:
    calls = [
        (prompt(20 + 9 * i, 60 + i), {"max_new_tokens": 64, "temperature": 0.9, "seed": 11 + i})
        for i in range(4)
    ]
    expected = [alone(engine, p, **kw) for p, kw in calls]
    batch = BatchEngine(engine, max_running=4)
    try:
        first = [
            batch.submit(p, engine.default_params(**kw)).result(timeout=300).token_ids for p, kw in calls
        ]
        together = [batch.submit(p, engine.default_params(**kw)) for p, kw in calls]
        second = [request.result(timeout=300).token_ids for request in together]
    finally:
        batch.close()
    assert first == expected and second == expected
    # The seed matters: another seed gives another draw.
    other = alone(engine, calls[0][0], **{**calls[0][1], "seed": 999})
    assert other != expected[0]


def test_a_conversation_reuses_its_committed_state_across_turns(engine: Engine) -> None:
    engine.prefix_cache.clear()
    batch = BatchEngine(engine, max_running=4)
    try:
        turn1 = prompt(70)
        first = batch.generate(turn1, engine.default_params(max_new_tokens=64))
        turn2 = turn1 + first.token_ids + prompt(20, 300)
        second = batch.generate(turn2, engine.default_params(max_new_tokens=64))
    finally:
        batch.close()
    assert second.reused_tokens >= 64  # started from the first turn's snapshot
    assert second.token_ids == alone(engine, turn2, max_new_tokens=64)


def test_the_queue_limit_refuses_with_a_retry_hint_and_a_cancelled_queued_request_never_runs(
    engine: Engine,
) -> None:
    batch = BatchEngine(engine, max_running=1, max_queued=1)
    try:
        running = batch.submit(prompt(10), engine.default_params(max_new_tokens=256))
        queued = batch.submit(prompt(11), engine.default_params(max_new_tokens=32))
        with pytest.raises(QueueFull) as refused:
            batch.submit(prompt(12), engine.default_params(max_new_tokens=32))
        assert refused.value.retry_after >= 1.0
        queued.cancel()
        with pytest.raises(RequestCancelled):
            queued.result(timeout=30)
        assert queued.started is None
        assert running.result(timeout=300).token_ids
    finally:
        batch.close()


def test_close_drains_or_cancels_and_then_refuses(engine: Engine) -> None:
    batch = BatchEngine(engine, max_running=2)
    drained = [batch.submit(prompt(9 + i), engine.default_params(max_new_tokens=64)) for i in range(3)]
    assert batch.close(drain=True, timeout=300)
    assert all(request.result().token_ids for request in drained)
    with pytest.raises(EngineClosed):
        batch.submit(prompt(5), engine.default_params())

    batch = BatchEngine(engine, max_running=1)
    long = [batch.submit(prompt(9 + i), engine.default_params(max_new_tokens=900)) for i in range(2)]
    assert batch.close(drain=False, timeout=120)
    for request in long:
        with pytest.raises(RequestCancelled):
            request.result()


def test_bad_requests_fail_at_submit_and_the_engine_goes_on(engine: Engine) -> None:
    batch = BatchEngine(engine, max_running=2)
    try:
        with pytest.raises(ValueError, match="vocabulary"):
            batch.submit([engine.config.vocab_size + 5], engine.default_params())
        with pytest.raises(ValueError, match="empty"):
            batch.submit([], engine.default_params())
        assert batch.generate(prompt(8), engine.default_params(max_new_tokens=32)).token_ids
    finally:
        batch.close()


def test_a_request_failing_in_its_own_loop_fails_alone_and_the_scheduler_goes_on(engine: Engine) -> None:
    """A temperature the parameters accept but float32 sampling turns into NaN: the request's
    loop raises between its forwards (not in a step); its neighbours keep their tokens, the
    scheduler keeps running, and nothing of it stays counted as running."""
    calls = [(prompt(20), {"max_new_tokens": 64}), (prompt(45, 60), {"max_new_tokens": 64})]
    expected = [alone(engine, p, **kw) for p, kw in calls]
    batch = BatchEngine(engine, max_running=4)
    try:
        neighbours = [batch.submit(p, engine.default_params(**kw)) for p, kw in calls]
        hostile = batch.submit(prompt(30, 90), engine.default_params(max_new_tokens=64, temperature=1e-308))
        with pytest.raises(RuntimeError, match="probability tensor"):
            hostile.result(timeout=120)
        assert [r.result(timeout=120).token_ids for r in neighbours] == expected
        assert batch.generate(
            prompt(8), engine.default_params(max_new_tokens=32)
        ).token_ids  # still scheduling
        stats = batch.stats()
        assert (stats.failed, stats.finished, stats.running, stats.running_cache_bytes) == (1, 3, 0, 0)
    finally:
        assert batch.close(timeout=60)


def test_events_stream_to_threads_and_to_asyncio_readers(engine: Engine) -> None:
    batch = BatchEngine(engine, max_running=2)
    try:
        request = batch.submit(prompt(30), engine.default_params(max_new_tokens=96))
        seen: list[object] = []
        reader = threading.Thread(target=lambda: seen.extend(request.events(timeout=120)))
        reader.start()

        async def read() -> list[object]:
            return [event async for event in request.aevents()]

        from_async = asyncio.run(read())
        reader.join(120)
    finally:
        batch.close()
    assert seen == from_async
    assert isinstance(seen[-1], GenerationDone)
    committed = [t for e in seen if isinstance(e, BlockCommitted) for t in e.token_ids]
    assert committed == seen[-1].result.token_ids
    assert request.first_block is not None and request.started is not None


def test_requests_are_independent_of_each_others_readers(engine: Engine, tmp_path: Path) -> None:
    """A request nobody reads does not hold the others back (events are kept, not blocked on)."""
    batch = BatchEngine(engine, max_running=3)
    try:
        ignored = batch.submit(prompt(25), engine.default_params(max_new_tokens=128))
        read = batch.submit(prompt(26), engine.default_params(max_new_tokens=64))
        assert read.result(timeout=300).token_ids
        assert ignored.result(timeout=300).token_ids == alone(engine, prompt(25), max_new_tokens=128)
    finally:
        batch.close()


def test_a_request_finished_early_ends_as_finished_with_what_it_committed(engine: Engine) -> None:
    """``finish`` (serve: a stop string was written) is a normal end, never a cancel: the result
    holds the tokens committed so far, and the engine counts it finished."""
    batch = BatchEngine(engine, max_running=1, max_queued=1)
    try:
        running = batch.submit(prompt(20, 130), engine.default_params(max_new_tokens=600, ignore_eos=True))
        queued = batch.submit(prompt(11), engine.default_params(max_new_tokens=32))
        first = next(e for e in running.events(timeout=120) if isinstance(e, BlockCommitted))
        queued.finish()  # still waiting: it never runs, and ends with nothing
        running.finish()
        running.cancel()  # after a finish, a cancel changes nothing
        result = running.result(timeout=120)
        events = list(running.events(timeout=60))
        assert queued.result(timeout=60).token_ids == [] and queued.started is None
        after = batch.generate(prompt(9), engine.default_params(max_new_tokens=32))  # the engine goes on
        stats = batch.stats()
    finally:
        assert batch.close(timeout=60)
    assert result.finish_reason == "stop" and 0 < len(result.token_ids) < 600
    assert result.token_ids[: len(first.token_ids)] == first.token_ids
    assert result.token_ids == [t for e in events if isinstance(e, BlockCommitted) for t in e.token_ids]
    assert isinstance(events[-1], GenerationDone) and events[-1].result == result
    assert running.finishing and not running.cancelled
    assert (stats.finished, stats.cancelled, stats.failed) == (3, 0, 0)
    assert after.token_ids == alone(engine, prompt(9), max_new_tokens=32)
