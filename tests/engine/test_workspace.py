"""The decoding workspace: one cache every call decodes in (what CUDA graphs are captured on, so
one capture per step shape serves every later call). Calls in it decode what calls in their own
caches do, reuse stored prefixes the same way, and never leave their state in a later call's way."""

from __future__ import annotations

import functools
import gc
import logging
import weakref
from io import StringIO
from pathlib import Path

import pytest
import torch

from clover_agent.engine.decoding.decoder import MIN_WORKSPACE_TOKENS, BlockDecoder
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted
from clover_agent.engine.engine import Engine
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import CloverModel
from tests.engine.decoding_helpers import BLOCK, clover_from_hf, tiny_hf_model


@functools.cache
def model() -> CloverModel:
    return clover_from_hf(tiny_hf_model(0, lm_scale=10.0))


PROMPT = list(range(5, 45))


def buffers(cache: ModelCache) -> list[int]:
    return [t.data_ptr() for layer in cache.layers for t in layer.buffers()]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "rehearsed-graphs"])
@pytest.mark.parametrize("mode", ["diffusion", "self_speculative", "autoregressive"])
def test_calls_in_the_workspace_decode_as_calls_in_their_own_caches(mode: str, graphs: bool) -> None:
    """A conversation of three turns then an unrelated prompt, with a prefix cache: the same tokens
    and the same reuse as a decoder that gives each call a cache of its own, in one set of buffers;
    also with every fixed-shape step going through ``StepGraphs`` as on a GPU (rehearsed: captures
    and replays on static buffers, the cache's bookkeeping after each replay)."""
    kept = BlockDecoder(model(), prefix_cache=PrefixCache(), workspace=True, rehearse_graphs=graphs)
    own = BlockDecoder(model(), prefix_cache=PrefixCache())
    prompt, seen = PROMPT, None
    for turn, new_tokens in enumerate((40, 30, 20)):
        params = SamplingParams(max_new_tokens=new_tokens, mode=mode, stop_token_ids=())
        got, want = kept.generate(prompt, params), own.generate(prompt, params)
        assert got.token_ids == want.token_ids, turn
        assert got.reused_tokens == want.reused_tokens, turn
        assert got.forwards == want.forwards, turn
        assert kept.workspace is not None
        if seen is not None:
            assert buffers(kept.workspace) == seen, turn  # the same buffers every turn
        seen = buffers(kept.workspace)
        prompt = prompt + got.token_ids + [11 + turn, 12, 13]
    assert kept.generate(PROMPT[3:], params).token_ids == own.generate(PROMPT[3:], params).token_ids
    assert buffers(kept.workspace) == seen
    assert own.workspace is None  # off unless asked for (or on with CUDA graphs)
    if graphs:
        steps = kept.step_graphs
        assert steps is not None and steps.replays > steps.captures > 0 and not steps.failed


def test_a_stored_snapshot_is_copied_in_and_never_written_to() -> None:
    prefix = PrefixCache()
    decoder = BlockDecoder(model(), prefix_cache=prefix, workspace=True)
    params = SamplingParams(max_new_tokens=30, stop_token_ids=())
    first = decoder.generate(PROMPT, params)
    snapshots = [entry.cache for entry in prefix._entries.values()]  # what the store holds
    before = [[t.clone() for t in snapshot.tensors()] for snapshot in snapshots]
    again = decoder.generate(PROMPT + first.token_ids + [7, 8], params)
    assert again.reused_tokens > len(PROMPT) // BLOCK * BLOCK
    for snapshot, then in zip(snapshots, before, strict=True):
        for a, b in zip(snapshot.tensors(), then, strict=True):
            assert torch.equal(a, b)  # exact: a stored snapshot is never written
    assert decoder.generate(PROMPT, params).token_ids == first.token_ids


def test_the_workspace_grows_by_powers_of_two_within_the_context_window() -> None:
    decoder = BlockDecoder(model(), workspace=True)
    small = decoder.workspace_for(100)
    assert small.capacity == MIN_WORKSPACE_TOKENS
    assert decoder.workspace_for(MIN_WORKSPACE_TOKENS) is small  # room enough: the same one
    window = model().config.max_position_embeddings
    assert window + 2 * BLOCK < 2 * MIN_WORKSPACE_TOKENS  # this checkpoint's window: 4096 tokens
    # The next power of two would be 8192 rows, but no call can use more than the window and the
    # two blocks a call may run past its end.
    grown = decoder.workspace_for(MIN_WORKSPACE_TOKENS + 1)
    assert grown is not small and grown.capacity == window + 2 * BLOCK
    assert decoder.workspace_for(window + 2 * BLOCK) is grown


@pytest.mark.parametrize("graphs", [False, True], ids=["workspace", "rehearsed-graphs"])
def test_a_growing_workspace_frees_the_old_one_before_making_the_new_one(
    graphs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Growth must not hold old and new at once (on a GPU, the K/V of a long context twice, and the
    old graphs): nothing keeps the old buffers alive when the new cache is made."""
    decoder = BlockDecoder(model(), prefix_cache=PrefixCache(), workspace=True, rehearse_graphs=graphs)
    decoder.generate(PROMPT, SamplingParams(max_new_tokens=8, stop_token_ids=()))
    assert decoder.workspace is not None
    old = weakref.ref(decoder.workspace.layers[-1].buffers()[0])
    alive: list[bool] = []
    new_cache = CloverModel.new_cache

    def spying(self: CloverModel, capacity: int = 0) -> ModelCache:
        gc.collect()
        alive.append(old() is not None)
        return new_cache(self, capacity)

    monkeypatch.setattr(CloverModel, "new_cache", spying)
    grown = decoder.workspace_for(MIN_WORKSPACE_TOKENS + 1)
    assert alive == [False] and grown.capacity > MIN_WORKSPACE_TOKENS
    monkeypatch.undo()
    # and the next call decodes as on a fresh decoder
    params = SamplingParams(max_new_tokens=20, stop_token_ids=())
    assert (
        decoder.generate(PROMPT, params).token_ids == BlockDecoder(model()).generate(PROMPT, params).token_ids
    )


def test_a_call_overtaken_by_a_later_one_stops_with_a_clear_error() -> None:
    decoder = BlockDecoder(model(), workspace=True)
    params = SamplingParams(max_new_tokens=96, stop_token_ids=())
    first = decoder.stream(PROMPT, params)
    event = next(first)
    while not isinstance(event, BlockCommitted):
        event = next(first)
    later = decoder.generate(PROMPT[5:], SamplingParams(max_new_tokens=20, stop_token_ids=()))
    assert (
        later.token_ids
        == BlockDecoder(model()).generate(PROMPT[5:], SamplingParams(max_new_tokens=20)).token_ids
    )
    with pytest.raises(RuntimeError, match="another call started on this decoder"):
        for _ in first:
            pass


@pytest.mark.parametrize("graphs", [False, True], ids=["workspace", "rehearsed-graphs"])
def test_a_call_overtaken_after_its_last_pass_does_not_store_the_later_calls_state(graphs: bool) -> None:
    """A call paused after its last pass needs no more forwards, but its finish stores the committed
    state for later calls: overtaken, it stops there with the error instead of storing the later
    call's state under its own tokens (a poisoned prefix the next call with its prompt would reuse)."""
    prompt = list(range(5, 5 + 2 * BLOCK))
    params = SamplingParams(max_new_tokens=40, stop_token_ids=())
    want = BlockDecoder(model()).generate(prompt, params).token_ids
    events = len(list(BlockDecoder(model()).stream(prompt, params)))
    decoder = BlockDecoder(model(), prefix_cache=PrefixCache(), workspace=True, rehearse_graphs=graphs)
    first = decoder.stream(prompt, params)
    for _ in range(events - 2):  # all but the last block's commit and the finish
        next(first)
    decoder.generate(list(range(200, 200 + BLOCK)), params)  # overtakes it
    assert isinstance(next(first), BlockCommitted)  # decided before it was overtaken
    with pytest.raises(RuntimeError, match="another call started on this decoder"):
        next(first)
    again = decoder.generate(prompt, params)
    assert again.token_ids == want
    assert again.reused_tokens == len(prompt)  # its own prefill's snapshot, stored before


def test_loading_a_state_copies_it_and_an_empty_load_resets() -> None:
    source = model().new_cache(128)
    model()(torch.arange(5, 5 + 2 * BLOCK), source, attention="block", commit=True, logit_rows=0)
    target = model().new_cache(256)
    model()(torch.arange(9, 9 + BLOCK), target, attention="block", commit=True, logit_rows=0)
    target.load(source)
    assert (target.length, target.commits, target.capacity) == (source.length, source.commits, 256)
    for got, want in zip(target.tensors(), source.tensors(), strict=True):
        assert torch.equal(got, want)  # exact: copied
    target.load(None)
    fresh = model().new_cache(256)
    assert target.length == 0 and target.commits == 0
    for got, want in zip(target.tensors(), fresh.tensors(), strict=True):
        assert torch.equal(got, want)  # exact: zeros
    with pytest.raises(ValueError, match="does not fit"):
        model().new_cache(BLOCK).load(source)


def test_graphs_asked_for_on_the_cpu_are_named_off_in_the_log(
    two_layer_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="clover_agent.engine"):
        engine = Engine.from_pretrained(two_layer_checkpoint, progress=None, cuda_graphs=True)
    assert engine.decoding_steps() == "eager: the model is on cpu, and CUDA graphs need a CUDA device"
    assert any("CUDA graphs off: the model is on cpu" in r.getMessage() for r in caplog.records)
    default = Engine.from_pretrained(two_layer_checkpoint, progress=None)
    assert default.decoding_steps() == "eager (CUDA graphs off)"  # the default: on CUDA devices only
    assert not default.decoder.keep_workspace


def test_the_agent_backend_prints_how_steps_run(checkpoint: Path) -> None:
    from clover_agent.backends.engine import EngineBackend

    progress = StringIO()
    EngineBackend(checkpoint, device="cpu", cuda_graphs=True, progress=progress).load_now()
    assert "engine: decoding steps: eager: the model is on cpu" in progress.getvalue()
