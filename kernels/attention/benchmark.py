"""The attention step's benchmark case at Clover's sizes (see ``clover_agent.kernels.bench``)."""

from __future__ import annotations

import functools

import torch

from clover_agent.kernels.attention import reference
from clover_agent.kernels.attention.kv_attention import attention_step
from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase, cycling, nbytes


def case(
    tokens: int = 32,
    *,
    context: int = 4096,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    copies: int = 2,
    seed: int = 0,
) -> KernelCase:
    """One layer's block-causal attention step of ``tokens`` queries after ``context`` committed rows:
    K/V written into the cache, attention, output gate. Bytes: the cache rows read, q, gate, the new
    K/V, the output."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hkv, d = sizes.heads, sizes.kv_heads, sizes.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    capacity = context + tokens
    inputs = [
        {
            "q": randn(tokens, h, d),
            "k_new": randn(tokens, hkv, d),
            "v_new": randn(tokens, hkv, d),
            "gate": randn(tokens, h, d),
            "k_cache": randn(capacity, hkv, d),
            "v_cache": randn(capacity, hkv, d),
        }
        for _ in range(copies)
    ]
    length = torch.tensor([context], device=device, dtype=torch.int32)

    def run(t: dict[str, torch.Tensor]) -> torch.Tensor:
        return attention_step(
            t["q"], t["k_new"], t["v_new"], t["k_cache"], t["v_cache"], length,
            block_size=sizes.block_size, scale=d**-0.5, gate=t["gate"],
        )  # fmt: skip

    def want(t: dict[str, torch.Tensor]) -> torch.Tensor:
        k_cache, v_cache = t["k_cache"].clone(), t["v_cache"].clone()
        reference.write_kv(t["k_new"], t["v_new"], k_cache, v_cache, context)
        return reference.block_attention(
            t["q"], k_cache, v_cache, context, block_size=sizes.block_size, scale=d**-0.5, gate=t["gate"]
        )

    t = inputs[0]
    moved = (
        nbytes(t["k_cache"], t["v_cache"])
        + nbytes(t["q"], t["gate"], t["k_new"], t["v_new"])
        + nbytes(t["q"])
    )
    return KernelCase(
        name=f"attention[{tokens}, context {context}]",
        run=cycling([functools.partial(run, args) for args in inputs]),
        reference=functools.partial(want, inputs[0]),
        bytes_moved=moved,
        shape=f"tokens={tokens} context={context} heads={h}/{hkv} head_dim={d}",
    )
