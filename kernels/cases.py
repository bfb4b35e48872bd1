"""Every kernel's benchmark cases at Clover's sizes, for ``bench/gpu_bench.py`` and the tests: each
operator folder's ``benchmark.case``, built on :mod:`clover_agent.kernels.bench` (which imports
none of them: the imports go one way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch

from clover_agent.kernels.attention import benchmark as attention_bench
from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase
from clover_agent.kernels.gated_delta_rule import benchmark as gdn_bench
from clover_agent.kernels.low_confidence import benchmark as low_confidence_bench
from clover_agent.kernels.moe import benchmark as moe_bench
from clover_agent.kernels.short_conv import benchmark as conv_bench


class _CaseOptions(TypedDict):
    """The keyword arguments :func:`cases` gives every operator's ``benchmark.case``."""

    device: str
    dtype: torch.dtype
    sizes: CloverSizes
    copies: int


def cases(
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    tokens: Sequence[int] = (32, 64),
    prefill_tokens: Sequence[int] = (4096,),
    context: int = 4096,
    copies: int = 2,
) -> list[KernelCase]:
    """Every kernel's cases at the decoding step shapes (``tokens``: a 32-token block, the 64-token
    fused commit + denoise step; attention after ``context`` committed tokens) and at prompt prefill
    chunks (``prefill_tokens``). ``copies``: input sets each case cycles through."""
    built: list[KernelCase] = []
    for count in tokens:
        options: _CaseOptions = {"device": device, "dtype": dtype, "sizes": sizes, "copies": copies}
        built.append(moe_bench.case(count, **options))
        built.append(conv_bench.case(count, **options))
        built.append(gdn_bench.case(count, **options))
        built.append(gdn_bench.case(count, commit=count, **options))
        built.append(attention_bench.case(count, context=context, **options))
        built.append(low_confidence_bench.case(count, **options))
        built.append(low_confidence_bench.case(count, sampling=True, **options))
    for count in prefill_tokens:
        built.append(
            gdn_bench.case(count, commit=count, method="chunk", device=device, dtype=dtype, sizes=sizes)
        )
    return built
