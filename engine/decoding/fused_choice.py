"""A denoising pass's token choice and LowConfidence fill as the fused Triton step
(``clover_agent.kernels.low_confidence.low_confidence_step``): two or three launches instead of the
15 to 39 PyTorch operators of :mod:`.choice` and :mod:`.controls`, the controls as the kernel's
``LogitsAdjustment``, and one read-back of the pass's result.

Greedy choice is the same as the PyTorch path's (the kernel's references are the engine's rules);
sampled draws come from the kernel's seeded Philox stream, so they match the PyTorch path in
distribution, not token for token. ``BlockDecoder(choice=...)`` picks the path: ``"auto"`` takes
this one on a CUDA device where the Triton kernels run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from clover_agent.engine.ops import triton_unusable
from clover_agent.engine.ops.transfer import upload

if TYPE_CHECKING:
    from clover_agent.engine.decoding.decoder import DecodeCall
    from clover_agent.engine.decoding.sampling import SamplingParams

CHOICES = ("auto", "torch", "triton")


def fused_choice_problem(params: SamplingParams, device: torch.device) -> str | None:
    """Why the fused step cannot serve these parameters on ``device`` (None when it can)."""
    problem = triton_unusable(device)
    if problem is not None:
        return problem
    from clover_agent.kernels.low_confidence import MAX_TOP_K

    if not params.greedy_draws and params.top_k > MAX_TOP_K:
        return f"top_k {params.top_k} is more than the kernel's {MAX_TOP_K}"
    return None


class FusedChoice:
    """The fused step for one call: its ``TokenChoice`` and its draw seed (a device counter)."""

    def __init__(self, params: SamplingParams, mask_token_id: int | None, device: torch.device) -> None:
        from clover_agent.kernels.low_confidence import TokenChoice

        self.choice = TokenChoice(
            temperature=0.0 if params.greedy_draws else params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            mask_token_id=mask_token_id,
            confidence_rule=params.confidence,  # type: ignore[arg-type]  # the same names
        )
        self.seed = torch.full(
            (1,), params.seed if params.seed is not None else 0, dtype=torch.long, device=device
        )

    def denoise(
        self, call: DecodeCall, logits: torch.Tensor, tokens: list[int], decided: list[bool], fill_all: bool
    ) -> bool:
        """``DecodeCall.denoise`` on the fused step: ``logits`` [len(tokens), V]; ``tokens`` and
        ``decided`` updated in place; whether LowConfidence fell back to one slot."""
        from clover_agent.kernels.low_confidence import low_confidence_step

        device = logits.device
        slots = len(tokens)
        base = len(call.generated)
        on_device = upload(tokens, device)
        done = upload(decided, device, torch.bool)
        adjustment = call.controls.adjustment([base + i for i in range(slots)], tokens, decided)
        # fill_all: every open slot passes a threshold below any confidence
        threshold = -1.0 if fill_all else call.threshold
        result = low_confidence_step(
            logits, on_device, done, self.choice, threshold, adjustment, seed=self.seed
        )
        values = torch.cat([on_device, result.fill.long(), result.fallback.long()]).tolist()
        for slot in range(slots):
            if values[slots + slot]:
                tokens[slot] = values[slot]
                decided[slot] = True
        return bool(values[-1]) and not fill_all
