"""The MoE block's benchmark case at Clover's sizes (see ``clover_agent.kernels.bench``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase, cycling, nbytes
from clover_agent.kernels.moe import reference
from clover_agent.kernels.moe.fused_moe import sparse_moe


def case(
    tokens: int = 32,
    *,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    copies: int = 2,
    seed: int = 0,
) -> KernelCase:
    """``sparse_moe`` over ``tokens`` tokens with random weights (routing spread like a real model's:
    ~160 of 256 experts active for 32 tokens). Bytes: the touched experts' weights, activations in
    and out."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = sizes.experts, sizes.hidden, sizes.moe_inner

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    gate_up = randn(e, 2 * i, h, scale=h**-0.5)
    down = randn(e, h, i, scale=i**-0.5)
    inputs = [
        {
            "x": randn(tokens, h),
            "router_logits": randn(tokens, e),
            "shared": randn(tokens, h),
            "shared_gate_logits": randn(tokens, 1),
            "residual": randn(tokens, h),
        }
        for _ in range(copies)
    ]

    def call(fn: Callable[..., torch.Tensor], args: dict[str, torch.Tensor]) -> torch.Tensor:
        return fn(
            args["x"],
            args["router_logits"],
            sizes.top_k,
            gate_up,
            down,
            shared=args["shared"],
            shared_gate_logits=args["shared_gate_logits"],
            residual=args["residual"],
        )

    ids, _ = reference.route(inputs[0]["router_logits"], sizes.top_k)
    touched = int(torch.unique(ids).numel())
    expert_bytes = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    activations = nbytes(*inputs[0].values()) + nbytes(inputs[0]["x"])  # inputs read, output written
    return KernelCase(
        name=f"moe[{tokens}]",
        run=cycling([functools.partial(call, sparse_moe, args) for args in inputs]),
        reference=functools.partial(call, reference.sparse_moe, inputs[0]),
        bytes_moved=touched * expert_bytes + activations,
        shape=f"tokens={tokens} experts={e} top_k={sizes.top_k} touched={touched} hidden={h} inner={i}",
    )
