"""Launcher of the short convolution kernel: one launch, no host read-back (graph-safe)."""

from __future__ import annotations

import torch
import triton

from clover_agent.kernels.short_conv import triton_kernels as tk


def short_conv(
    rows: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    right_weight: torch.Tensor | None = None,
    block_size: int | None = None,
    activation: bool = False,
) -> torch.Tensor:
    """Contract of :func:`reference.short_conv`: rows [T, C] (unit stride in C), weight [C, K],
    state [C, K-1] (read, never written), right_weight [C, K_r] or None, block_size (rows start on a
    block boundary), activation = SiLU. Returns a new [T, C] tensor in rows' dtype."""
    steps, channels = rows.shape
    kernel = weight.shape[1]
    if state.shape != (channels, kernel - 1):
        raise ValueError(f"conv state must be [{channels}, {kernel - 1}], got {tuple(state.shape)}")
    if right_weight is not None and block_size is None:
        raise ValueError("the right convolution needs block_size")
    x = rows if rows.stride(-1) == 1 else rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    state = state if state.stride(-1) == 1 else state.contiguous()
    right = right_weight if right_weight is not None else weight
    right = right if right.stride(-1) == 1 else right.contiguous()
    out = torch.empty(steps, channels, dtype=rows.dtype, device=rows.device)
    if steps == 0:
        return out
    block_t, block_c = 16, min(256, triton.next_power_of_2(channels))
    # 8 warps: with 4, a 16 x 256 tile needs more than 255 registers a thread on sm_90 and spills
    # (tests/kernels/test_hopper_compile.py).
    tk.short_conv_kernel[(triton.cdiv(steps, block_t), triton.cdiv(channels, block_c))](
        x,
        weight,
        state,
        right,
        out,
        steps,
        channels,
        block_size or 1,
        x.stride(0),
        weight.stride(0),
        state.stride(0),
        right.stride(0),
        out.stride(0),
        KERNEL=kernel,
        RIGHT_KERNEL=right_weight.shape[1] if right_weight is not None else 0,
        SILU=activation,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
        num_warps=8,
    )
    return out


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Contract of ``ops.causal_conv1d`` (:func:`reference.causal_conv1d`): the causal taps only."""
    return short_conv(x, weight, state)
