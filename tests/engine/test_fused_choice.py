"""A denoising pass's token choice on the fused Triton step (``choice="triton"``; on a GPU the
default) against the PyTorch path, in the interpreter: greedy decodes are the same tokens with and
without controls, sampled ones are reproducible and obey the controls, and a pass still reads the
device once and uploads nothing that waits."""

from __future__ import annotations

import functools

import pytest

from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.model.network import CloverModel
from tests.engine.decoding_helpers import clover_from_hf, tiny_hf_model
from tests.engine.test_host_syncs import transfers
from tests.kernels.helpers import requires_triton

pytestmark = requires_triton

PROMPT = list(range(5, 45))
THINK_END = 9
CONTROLS = {
    "repetition_penalty": 1.3,
    "presence_penalty": 0.2,
    "thinking": True,
    "thinking_budget": 20,
    "think_end_token_id": THINK_END,
    "end_bias_start": 0.5,
}


@functools.cache
def model() -> CloverModel:
    return clover_from_hf(tiny_hf_model(0, lm_scale=10.0))


@pytest.mark.parametrize("mode", ["diffusion", "self_speculative"])
@pytest.mark.parametrize("options", [{}, CONTROLS], ids=["bare", "controls"])
def test_greedy_decodes_are_the_pytorch_paths(mode: str, options: dict) -> None:
    params = SamplingParams(max_new_tokens=48, mode=mode, stop_token_ids=(), **options)
    fused = BlockDecoder(model(), choice="triton").generate(PROMPT, params)
    plain = BlockDecoder(model(), choice="torch").generate(PROMPT, params)
    assert fused.token_ids == plain.token_ids
    assert fused.steps_per_block == plain.steps_per_block  # the same fills, pass by pass
    assert fused.fallback_steps == plain.fallback_steps


def test_sampled_decodes_are_reproducible_and_obey_the_controls() -> None:
    # Unfiltered draws at a high temperature: this tiny model's logits are peaked, and the
    # interpreter runs the top-k kernel path slowly (tests/kernels cover the filters).
    params = SamplingParams(max_new_tokens=32, temperature=1.5, seed=3, stop_token_ids=(), **CONTROLS)
    decoder = BlockDecoder(model(), choice="triton")
    first = decoder.generate(PROMPT, params)
    assert decoder.generate(PROMPT, params).token_ids == first.token_ids  # the same seed, the same draws
    # at most one </think>, and none after the budget's hard close at position 20
    assert first.token_ids.count(THINK_END) == 1 and first.token_ids.index(THINK_END) <= 20
    other = decoder.generate(PROMPT, SamplingParams(**{**params.__dict__, "seed": 4}))
    assert other.token_ids != first.token_ids


def test_a_pass_reads_once_and_uploads_nothing_that_waits() -> None:
    decoder = BlockDecoder(model(), choice="triton")
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(), **CONTROLS)
    with transfers() as seen:
        result = decoder.generate(PROMPT, params)
    assert len(seen.reads) == sum(result.steps_per_block), seen.reads.where
    assert len(seen.uploads) == 0, seen.uploads.where


def test_the_fused_path_names_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="choice must be one of auto, torch, triton"):
        BlockDecoder(model(), choice="fast")
    too_wide = SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5000)
    with pytest.raises(ValueError, match=r"choice='triton' cannot run: top_k 5000 is more than"):
        BlockDecoder(model(), choice="triton").generate(PROMPT, too_wide)
    # "auto" on the CPU is the PyTorch path
    assert BlockDecoder(model()).generate(PROMPT, too_wide).token_ids
