"""Adapters from the engine's operator signatures (``ops.py``) to ``clover_agent.kernels`` Triton
functions whose signatures differ. Imported only when a Triton operator is resolved."""

from __future__ import annotations

import torch

from clover_agent.kernels.attention import block_attention


def attention(
    q: torch.Tensor,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    past: int | torch.Tensor,
    block_size: int,
    block_from: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch_ops.attention``'s contract on the split-K flash kernel, which reads the committed
    length from device memory (``block_size=1`` is its causal rule). Causal rows then block rows (a
    causal-context commit fused with a denoising pass) are two calls: the block rows sit after the
    causal ones, so they see them and their own block."""
    # A fill, not a copy from the host: torch.tensor([past], device=...) would wait for the device.
    length = past.reshape(1) if isinstance(past, torch.Tensor) else torch.full((1,), past, device=q.device)

    def attend(rows: slice, start: torch.Tensor, rule: int) -> torch.Tensor:
        return block_attention(
            q[rows],
            key_buffer,
            value_buffer,
            start,
            block_size=rule,
            scale=scale,
            gate=None if gate is None else gate[rows],
        )

    if block_from is None:
        return attend(slice(None), length, 1)
    if block_from == 0:
        return attend(slice(None), length, block_size)
    causal = attend(slice(0, block_from), length, 1)
    return torch.cat([causal, attend(slice(block_from, None), length + block_from, block_size)])
