"""Launchers of the token choice and LowConfidence kernels. Nothing is read back to the host and the
grids depend only on the number of rows, so a step is graph-safe; the per-call numbers of
:class:`TokenChoice` and the penalties are compile-time or scalar arguments, the per-step ones
(counts, biases, forced rows, the seed) are device tensors.
"""

from __future__ import annotations

import torch
import triton

from clover_agent.kernels.low_confidence import triton_kernels as tk
from clover_agent.kernels.low_confidence.reference import (
    LogitsAdjustment,
    StepResult,
    TokenChoice,
    step_counts,
)

#: Largest top_k taken from the one-pass candidate list; a larger one is found by bisection.
MAX_TOP_K = 256
#: Vocabulary columns per tile.
BLOCK_V = 2048


def choose_tokens(
    logits: torch.Tensor,
    choice: TokenChoice,
    adjustment: LogitsAdjustment | None = None,
    *,
    seed: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    decided: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of :func:`reference.choose_tokens` on ``adjust_logits(logits, adjustment)``, fused:
    logits [T, V] (any float dtype, unit stride over V) are only read. Returns new (chosen [T]
    int64, confidence [T] float32).

    Sampling needs ``seed``, a one-element int64 tensor on the device; the draw is keyed by it and
    it is advanced in place (+1), so consecutive calls (and replays of a captured graph) draw
    afresh. ``counts`` overrides ``adjustment.counts``. With ``decided`` [T] bool (and ``tokens``
    [T] int64), decided rows are skipped: they get their token and confidence -inf.
    """
    rows, vocab = logits.shape
    if not choice.greedy and (seed is None or seed.numel() != 1 or seed.dtype != torch.int64):
        raise ValueError("sampling needs seed: a one-element int64 tensor on the logits' device")
    if decided is not None and tokens is None:
        raise ValueError("decided rows need their tokens")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    device = logits.device
    chosen = torch.empty(rows, dtype=torch.int64, device=device)
    confidence = torch.empty(rows, dtype=torch.float32, device=device)
    if rows == 0:
        return chosen, confidence
    adjustment = adjustment or LogitsAdjustment()
    penalize = adjustment.penalizing
    counts = (counts if counts is not None else adjustment.counts) if penalize else None
    bias_ids = adjustment.bias_token_ids
    num_bias = 0 if bias_ids is None else bias_ids.numel()
    row_bias = confidence  # a valid pointer for arguments a constexpr switches off
    if num_bias:
        if adjustment.row_bias is None or adjustment.row_bias.shape != (rows, num_bias):
            raise ValueError(f"row_bias must be [{rows}, {num_bias}] for {num_bias} bias tokens")
        row_bias = adjustment.row_bias.float().contiguous()
    sampling_top_k = 0 < choice.top_k < vocab and not choice.greedy
    bisect_k = sampling_top_k and choice.top_k > MAX_TOP_K
    top_k_block = triton.next_power_of_2(choice.top_k) if sampling_top_k and not bisect_k else 0
    block_v = max(min(BLOCK_V, triton.next_power_of_2(vocab)), top_k_block, 16)
    anything = chosen
    tk.choose_kernel[(rows,)](
        logits,
        counts if counts is not None else anything,
        bias_ids if num_bias else anything,
        row_bias,
        adjustment.forced_token if adjustment.forced_token is not None else anything,
        decided if decided is not None else anything,
        tokens if tokens is not None else anything,
        seed if seed is not None else anything,
        chosen,
        confidence,
        vocab,
        logits.stride(0),
        row_bias.stride(0),
        -1 if choice.mask_token_id is None else choice.mask_token_id,
        adjustment.repetition_penalty,
        adjustment.presence_penalty,
        adjustment.frequency_penalty,
        1.0 if choice.greedy else 1.0 / choice.temperature,
        choice.top_k,
        choice.top_p,
        PENALIZE=penalize,
        NUM_BIAS=num_bias,
        HAS_FORCED=adjustment.forced_token is not None,
        HAS_DECIDED=decided is not None,
        GREEDY=choice.greedy,
        TOP_K_BLOCK=top_k_block,
        TOP_P=choice.top_p < 1.0 and not choice.greedy,
        BISECT_K=bisect_k,
        SGLANG=choice.confidence_rule == "sglang" and not choice.greedy,
        BLOCK_V=block_v,
    )
    if not choice.greedy:
        assert seed is not None  # sampling without a seed raised above
        seed.add_(1)
    return chosen, confidence


def low_confidence_step(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    decided: torch.Tensor,
    choice: TokenChoice,
    threshold: float,
    adjustment: LogitsAdjustment | None = None,
    *,
    seed: torch.Tensor | None = None,
) -> StepResult:
    """Contract of :func:`reference.low_confidence_step`, fused and without a host read-back: logits
    [T, V] read-only (rows of decided positions are never read); ``tokens`` [T] int64 and
    ``decided`` [T] bool updated in place; the draw keyed by ``seed`` (see :func:`choose_tokens`).
    The block's decided tokens join the penalty counts. Two launches (three when penalizing)."""
    counts = None
    if adjustment is not None and adjustment.penalizing:
        counts = step_counts(adjustment, tokens, decided)
    chosen, confidence = choose_tokens(
        logits, choice, adjustment, seed=seed, counts=counts, decided=decided, tokens=tokens
    )
    rows = tokens.shape[0]
    fill = torch.empty(rows, dtype=torch.bool, device=tokens.device)
    done = torch.empty(1, dtype=torch.bool, device=tokens.device)
    fallback = torch.empty(1, dtype=torch.bool, device=tokens.device)
    tk.fill_kernel[(1,)](
        chosen, confidence, tokens, decided, fill, done, fallback, rows, threshold,
        BLOCK_T=max(16, triton.next_power_of_2(rows)),
    )  # fmt: skip
    return StepResult(chosen, confidence, fill, done, fallback)
