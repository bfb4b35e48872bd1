"""Prefix reuse across calls: same tokens as a cold call, fewer forwards, bounded memory."""

from __future__ import annotations

import functools

import pytest
import torch

from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.model.network import CloverModel
from tests.engine.decoding_helpers import BLOCK, clover_from_hf, tiny_hf_model


@functools.cache
def model() -> CloverModel:
    return clover_from_hf(tiny_hf_model(0, lm_scale=10.0))


PROMPT = list(range(5, 45))


@pytest.mark.parametrize("mode", ["diffusion", "self_speculative", "autoregressive"])
def test_second_turn_reuses_the_first_and_matches_a_cold_call(mode: str) -> None:
    cache = PrefixCache()
    warm = BlockDecoder(model(), prefix_cache=cache)
    first = warm.generate(PROMPT, SamplingParams(max_new_tokens=50, mode=mode))
    # The agent's next prompt: the whole first exchange plus a new user turn.
    second_prompt = PROMPT + first.token_ids + [11, 12, 13, 14, 15]
    params = SamplingParams(max_new_tokens=30, mode=mode)
    second = warm.generate(second_prompt, params)
    cold = BlockDecoder(model()).generate(second_prompt, params)
    assert second.token_ids == cold.token_ids
    assert second.reused_tokens > len(PROMPT) // BLOCK * BLOCK  # reused past the first prompt
    assert cold.reused_tokens == 0
    assert second.forwards < cold.forwards
    # Repeating a call gives the same answer again (stored snapshots are never written to).
    assert warm.generate(second_prompt, params).token_ids == cold.token_ids


def test_states_of_different_attention_rules_are_not_mixed() -> None:
    cache = PrefixCache()
    decoder = BlockDecoder(model(), prefix_cache=cache)
    decoder.generate(PROMPT + PROMPT, SamplingParams(max_new_tokens=8))
    causal = decoder.generate(PROMPT + PROMPT, SamplingParams(max_new_tokens=8, mode="autoregressive"))
    assert causal.reused_tokens == 0
    again = decoder.generate(PROMPT + PROMPT, SamplingParams(max_new_tokens=8))
    assert again.reused_tokens == len(PROMPT + PROMPT) // BLOCK * BLOCK


def snapshot(tokens: list[int]) -> object:
    state = model().new_cache()
    model()(torch.tensor(tokens), state, attention="block", commit=True)
    return state


def test_least_recently_used_snapshots_are_evicted_within_the_byte_budget() -> None:
    a, b, c = ([t] * BLOCK for t in (3, 4, 5))
    size = snapshot(a).nbytes()
    cache = PrefixCache(max_bytes=2 * size)
    cache.store(a, "block", snapshot(a))
    cache.store(b, "block", snapshot(b))
    assert cache.lookup([*a, 9], "block", max_length=BLOCK) is not None  # a is now the most recent
    cache.store(c, "block", snapshot(c))
    assert len(cache) == 2 and cache.nbytes <= 2 * size
    assert cache.lookup([*b, 9], "block", max_length=BLOCK) is None  # b was least recently used
    assert cache.lookup([*a, 9], "block", max_length=BLOCK) is not None
    assert cache.lookup(c, "block", max_length=BLOCK) is not None
    tiny = PrefixCache(max_bytes=size - 1)
    tiny.store(a, "block", snapshot(a))
    assert len(tiny) == 0  # larger than the whole budget: not kept


def test_lookup_returns_the_longest_matching_prefix_as_a_private_copy() -> None:
    short, long = [7] * BLOCK, [7] * BLOCK + [8] * BLOCK
    cache = PrefixCache()
    cache.store(short, "block", snapshot(short))
    cache.store(long, "block", snapshot(long))
    found = cache.lookup([*long, 1, 2], "block", max_length=2 * BLOCK)
    assert found is not None and found.length == 2 * BLOCK
    assert cache.lookup([*long, 1, 2], "block", max_length=2 * BLOCK - 1).length == BLOCK
    assert cache.lookup([7] * BLOCK + [9] * BLOCK, "block", max_length=2 * BLOCK).length == BLOCK
    before = [t.clone() for t in cache.lookup(long, "block", max_length=2 * BLOCK).tensors()]
    model()(torch.tensor([1] * BLOCK), found, attention="block", commit=True)  # write to the copy
    after = cache.lookup(long, "block", max_length=2 * BLOCK).tensors()
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))  # exact: the entry is untouched
    with pytest.raises(ValueError, match="covers"):
        cache.store([1, 2], "block", snapshot(short))
