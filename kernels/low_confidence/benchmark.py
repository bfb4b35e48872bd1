"""The LowConfidence step's benchmark cases at Clover's vocabulary (see ``clover_agent.kernels.bench``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypedDict

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase, cycling, nbytes
from clover_agent.kernels.low_confidence import reference
from clover_agent.kernels.low_confidence.choose import low_confidence_step
from clover_agent.kernels.low_confidence.reference import LogitsAdjustment, StepResult, TokenChoice


class _Sampling(TypedDict, total=False):
    """Sampling fields of a :class:`TokenChoice`."""

    temperature: float
    top_k: int
    top_p: float


#: Qwen's coding preset for sampling.
CODING: _Sampling = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def case(
    tokens: int = 32,
    *,
    sampling: bool = False,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    copies: int = 4,
    seed: int = 0,
) -> KernelCase:
    """One denoising step's token choice and fill over ``tokens`` float32 logit rows of the full
    vocabulary (every fourth row already decided), with a repetition penalty; greedy, or with
    ``sampling`` the coding preset (then there is no reference to compare: the draws of the two
    differ by design, their distributions are tested in tests/kernels). ``dtype`` is unused: the
    engine's logits are float32. Bytes: the open rows' logits per pass over them and the counts."""
    del dtype
    gen = torch.Generator(device=device).manual_seed(seed)
    vocab = sizes.vocab
    counts = torch.zeros(vocab, device=device)
    counts[torch.randint(0, vocab, (min(256, vocab),), generator=gen, device=device)] = 1.0
    adjust = LogitsAdjustment(counts=counts, repetition_penalty=1.05)
    choice = TokenChoice(mask_token_id=sizes.mask_token_id, **(CODING if sampling else {}))
    decided = torch.arange(tokens, device=device) % 4 == 0
    start = torch.where(decided, 17, sizes.mask_token_id)
    logits = [torch.randn(tokens, vocab, generator=gen, device=device) * 4 for _ in range(copies)]
    draw_seed = torch.tensor([seed], device=device)

    def step(
        rows: torch.Tensor, fn: Callable[..., StepResult] = low_confidence_step, **extra: torch.Tensor
    ) -> torch.Tensor:
        state, done = start.clone(), decided.clone()
        fn(rows, state, done, choice, 0.9, adjust, **extra)
        return state

    open_rows = int((~decided).sum())
    passes = 3 if sampling else 1
    return KernelCase(
        name=f"low_confidence[{tokens}{', sampling' if sampling else ''}]",
        run=cycling([functools.partial(step, rows, seed=draw_seed) for rows in logits]),
        reference=None if sampling else functools.partial(step, logits[0], reference.low_confidence_step),
        bytes_moved=passes * open_rows * vocab * 4 + nbytes(counts),
        shape=f"rows={tokens} open={open_rows} vocab={vocab} {'coding sampling' if sampling else 'greedy'}",
    )
