"""Denoising, draft and verify passes leave the committed state bit for bit as it was; only commit
passes change it. Observed on the state tensors themselves (not on the engine's commit counter)."""

from __future__ import annotations

import pytest
import torch

from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.sampling import SamplingParams
from tests.engine.decoding_helpers import MASK_ID, clover_from_hf, tiny_hf_model


@pytest.mark.parametrize("mode", ["diffusion", "self_speculative"])
def test_only_commit_passes_change_the_committed_state(mode: str) -> None:
    model = clover_from_hf(tiny_hf_model(0, lm_scale=10.0))
    passes: list[tuple[int, bool]] = []  # (tokens committed by the pass, state changed)
    before: list[tuple[int, list[torch.Tensor]]] = []

    def pre_hook(module, args, kwargs):
        cache = args[1]
        before.append((cache.length, [t.clone() for t in cache.tensors()]))

    def hook(module, args, kwargs, output):
        cache = args[1]
        length, tensors = before.pop()
        now = cache.tensors()
        same = len(now) == len(tensors) and all(  # exact: did the pass write the state at all?
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(tensors, now, strict=True)
        )
        passes.append((cache.length - length, not same))

    handles = [
        model.register_forward_pre_hook(pre_hook, with_kwargs=True),
        model.register_forward_hook(hook, with_kwargs=True),
    ]
    try:
        prompt = torch.randint(1, MASK_ID, (45,), generator=torch.Generator().manual_seed(2)).tolist()
        result = BlockDecoder(model).generate(prompt, SamplingParams(max_new_tokens=80, mode=mode))
    finally:
        for handle in handles:
            handle.remove()
    assert result.forwards == len(passes)
    read_only = [changed for committed, changed in passes if committed == 0]
    writing = [changed for committed, changed in passes if committed > 0]
    assert read_only and not any(read_only)  # no pass that committed nothing touched the state
    assert writing and all(writing)
    assert len(writing) == result.commits
