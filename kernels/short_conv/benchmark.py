"""The short convolution's benchmark case at Clover's sizes (see ``clover_agent.kernels.bench``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase, cycling, nbytes
from clover_agent.kernels.short_conv import reference
from clover_agent.kernels.short_conv.conv import short_conv


def case(
    tokens: int = 32,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    copies: int = 4,
    seed: int = 0,
) -> KernelCase:
    """Causal + right conv + SiLU over one block's pre-conv rows [tokens, conv_dim]."""
    gen = torch.Generator(device=device).manual_seed(seed)
    channels = sizes.conv_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    weight, right = randn(channels, sizes.conv_kernel), randn(channels, sizes.right_conv_kernel)
    inputs = [(randn(tokens, channels), randn(channels, sizes.conv_kernel - 1)) for _ in range(copies)]

    def call(fn: Callable[..., torch.Tensor], rows: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return fn(rows, weight, state, right, sizes.block_size, activation=True)

    rows, state = inputs[0]
    return KernelCase(
        name=f"short_conv[{tokens}]",
        run=cycling([functools.partial(call, short_conv, *args) for args in inputs]),
        reference=functools.partial(call, reference.short_conv, *inputs[0]),
        bytes_moved=2 * nbytes(rows) + nbytes(state, weight, right),
        shape=f"tokens={tokens} channels={channels} kernel={sizes.conv_kernel}+{sizes.right_conv_kernel}",
    )
