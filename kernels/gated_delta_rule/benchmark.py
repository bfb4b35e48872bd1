"""The GDN core's benchmark cases at Clover's sizes (see ``clover_agent.kernels.bench``): a decoding
step (bidirectional, the committed state read) and a chunked prefill (``method="chunk"``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes, KernelCase, cycling, nbytes
from clover_agent.kernels.gated_delta_rule import reference
from clover_agent.kernels.gated_delta_rule.gdn import Method, gated_delta_net


def case(
    tokens: int = 32,
    *,
    commit: int = 0,
    method: Method = "auto",
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    sizes: CloverSizes = CLOVER,
    copies: int = 2,
    seed: int = 0,
) -> KernelCase:
    """``gated_delta_net`` over ``tokens`` tokens of one layer: both branches, mix and gated norm, the
    state after ``commit`` tokens stored. Bytes: the conv output, g, beta, z and the state read, the
    output (and the committed state) written."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hk, hv, dk, dv = sizes.gdn_key_heads, sizes.gdn_value_heads, sizes.gdn_key_dim, sizes.gdn_value_dim

    def one() -> dict[str, torch.Tensor]:
        mixed = torch.randn(tokens, sizes.conv_dim, generator=gen, device=device).to(dtype)
        key_dim = hk * dk
        return {
            "q": mixed[:, :key_dim].view(tokens, hk, dk),
            "k": mixed[:, key_dim : 2 * key_dim].view(tokens, hk, dk),
            "v": mixed[:, 2 * key_dim :].view(tokens, hv, dv),
            "g": -torch.rand(tokens, hv, generator=gen, device=device),
            "beta": torch.rand(tokens, hv, generator=gen, device=device).to(dtype),
            "state": torch.randn(hv, dk, dv, generator=gen, device=device) * 0.1,
            "z": torch.randn(tokens, hv, dv, generator=gen, device=device).to(dtype),
        }

    weight = torch.ones(dv, device=device, dtype=dtype)
    mix = torch.randn(hv, 2, generator=gen, device=device)
    inputs = [one() for _ in range(copies)]

    def call(
        fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
        t: dict[str, torch.Tensor],
        **extra: Method,
    ) -> torch.Tensor:
        return fn(
            t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"], dk**-0.5, t["z"], weight, sizes.rms_eps,
            commit=commit, block_size=sizes.block_size, mix_logits=mix, normalize_qk=True, **extra,
        )[0]  # fmt: skip

    t = inputs[0]
    moved = nbytes(t["q"]) * sizes.conv_dim // (hk * dk) + nbytes(t["g"], t["beta"], t["state"], t["z"])
    moved += nbytes(t["z"]) + (nbytes(t["state"]) if commit else 0)
    return KernelCase(
        name=f"gated_delta_net[{tokens}{', commit' if commit else ''}{', ' + method if method != 'auto' else ''}]",
        run=cycling([functools.partial(call, gated_delta_net, args, method=method) for args in inputs]),
        reference=functools.partial(call, reference.gated_delta_net, inputs[0]),
        bytes_moved=moved,
        shape=f"tokens={tokens} heads={hk}/{hv} dims={dk}/{dv} bidirectional commit={commit}",
    )
