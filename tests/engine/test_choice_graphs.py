"""Denoising passes captured with their token choice (``fused_choice.ChoiceProgram``): on CUDA
graphs a pass is one replay — the forward, then the fused LowConfidence step on the device — and
one read-back. Here the graphs are rehearsed (``BlockDecoder(rehearse_graphs=True)``: every
"replay" runs the captured step eagerly on the graphs' static buffers, everything but the CUDA
graph itself), in the interpreter, against the fused step outside the graphs, which
tests/engine/test_fused_choice.py checks against the PyTorch path."""

from __future__ import annotations

import functools

import pytest

from clover_agent.engine.decoding import graphs as graphs_module
from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.fused_choice import PassVariant
from clover_agent.engine.decoding.graphs import StepShape
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.model.network import CloverModel
from tests.engine.decoding_helpers import BLOCK, clover_from_hf, tiny_hf_model
from tests.engine.test_fused_choice import CONTROLS, PROMPT
from tests.engine.test_host_syncs import transfers
from tests.kernels.helpers import requires_triton

pytestmark = requires_triton

SAMPLED = {"temperature": 1.5, "seed": 3}
#: A prompt of whole blocks: every pass of every block is a whole block (the program's shapes).
ALIGNED = list(range(5, 5 + 2 * BLOCK))


@functools.cache
def model() -> CloverModel:
    return clover_from_hf(tiny_hf_model(0, lm_scale=10.0))


def programs(decoder: BlockDecoder) -> list[tuple[StepShape, PassVariant]]:
    """The keys of the captured passes (a bare forward's key is its shape alone)."""
    graphs = decoder.step_graphs
    assert graphs is not None
    return [key for key in graphs.graphs if isinstance(key, tuple)]


@pytest.mark.parametrize(
    ("options", "fuse_commit"),
    [({}, True), (CONTROLS, True), ({**SAMPLED, **CONTROLS}, False)],
    ids=["bare", "controls", "sampled-unfused"],
)
def test_captured_passes_decode_as_the_fused_step_does(options: dict, fuse_commit: bool) -> None:
    """The same tokens, passes and fallbacks as the fused step outside graphs — greedy and sampled
    (the draws follow the same seed counter), with penalties, the thinking budget's hard close and
    the end bias — over two calls on one decoder, the second replaying what the first captured."""
    params = SamplingParams(max_new_tokens=48, stop_token_ids=(), fuse_commit=fuse_commit, **options)
    plain = BlockDecoder(model(), choice="triton").generate(PROMPT, params)
    decoder = BlockDecoder(model(), choice="triton", rehearse_graphs=True)
    first = decoder.generate(PROMPT, params)
    graphs = decoder.step_graphs
    assert graphs is not None
    captured = programs(decoder)
    # a block's pass after nothing, and (fused commits) after the block it commits
    assert {(s.tokens, s.commit) for s, _ in captured} == (
        {(BLOCK, 0), (2 * BLOCK, BLOCK)} if fuse_commit else {(BLOCK, 0)}
    )
    captures = graphs.captures
    second = decoder.generate(PROMPT, params)
    assert graphs.captures == captures  # the second call captured nothing
    for result in (first, second):
        assert result.token_ids == plain.token_ids
        assert result.steps_per_block == plain.steps_per_block
        assert result.fallback_steps == plain.fallback_steps
        assert result.forwards == plain.forwards
    if options:
        variant = captured[0][1]
        assert variant.penalties == (1.3, 0.2, 0.0)
        assert variant.forcing and len(variant.columns) == 2  # </think>, and the response end
        assert first.token_ids.count(9) == 1 and first.token_ids.index(9) <= 20  # the budget's close


def test_every_pass_of_an_aligned_prompt_is_one_replay_and_one_read() -> None:
    """With the prompt in whole blocks, every denoising pass (and each fused commit with it) is one
    replay of a captured program: the forward and the choice in it, nothing uploaded that waits,
    one read-back a pass."""
    decoder = BlockDecoder(model(), choice="triton", rehearse_graphs=True)
    params = SamplingParams(max_new_tokens=96, stop_token_ids=(), **CONTROLS)
    decoder.generate(ALIGNED, params)  # captures
    graphs = decoder.step_graphs
    assert graphs is not None
    before = dict(graphs.replayed)
    with transfers() as seen:
        result = decoder.generate(ALIGNED, params)
    passes = sum(result.steps_per_block)
    program = sum(n - before.get(key, 0) for key, n in graphs.replayed.items() if isinstance(key, tuple))
    assert program == passes
    assert len(seen.reads) == passes, seen.reads.where
    assert len(seen.uploads) == 0, seen.uploads.where


def test_a_prompt_tail_block_runs_outside_the_program_and_the_next_pass_restages() -> None:
    """A first block after a prompt tail is shorter than a block: it runs the graph-free fused step;
    the program's buffers then no longer hold the block and are staged again on its next pass; a
    later call on the same buffers gets none of the last call's state."""
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(), **CONTROLS)
    decoder = BlockDecoder(model(), choice="triton", rehearse_graphs=True)
    assert len(PROMPT) % BLOCK  # a tail: the first block holds prompt tokens
    for prompt in (PROMPT, ALIGNED, PROMPT):
        got = decoder.generate(prompt, params)
        assert got.token_ids == BlockDecoder(model(), choice="triton").generate(prompt, params).token_ids


def test_a_new_penalty_after_a_loop_is_a_new_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The penalties' numbers are baked into a captured pass: ``loop_action="penalize"`` raises the
    repetition penalty after a repeated block, and the passes after it are a capture of their own."""
    params = SamplingParams(
        max_new_tokens=7 * BLOCK,
        stop_token_ids=(),
        loop_action="penalize",
        loop_penalty=1.5,
        repetition_penalty=1.01,
    )
    prompt = [7] * (2 * BLOCK)
    decoder = BlockDecoder(model(), choice="triton", rehearse_graphs=True)
    result = decoder.generate(prompt, params)
    assert result.token_ids == BlockDecoder(model(), choice="triton").generate(prompt, params).token_ids
    blocks = [tuple(result.token_ids[i : i + BLOCK]) for i in range(0, len(result.token_ids), BLOCK)]
    repeated = [i for i, block in enumerate(blocks) if block in blocks[:i]]
    assert repeated and repeated[0] < len(blocks) - 1  # this model repeats a block before the end
    penalties = [variant.penalties for shape, variant in programs(decoder) if shape.commit == 0]
    assert penalties == [(1.01, 0.0, 0.0), (1.01 * 1.5, 0.0, 0.0)]

    # Captures are bounded: past MAX_GRAPHS a new key runs eager (a forward graph and the fused step
    # apart), decoding the same tokens.
    steps = decoder.step_graphs
    assert steps is not None and not steps.full
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", len(steps.graphs) - 1)
    bounded = BlockDecoder(model(), choice="triton", rehearse_graphs=True)
    assert bounded.generate(prompt, params).token_ids == result.token_ids
    assert bounded.step_graphs is not None and bounded.step_graphs.full
    assert len(bounded.step_graphs.graphs) == len(steps.graphs) - 1
