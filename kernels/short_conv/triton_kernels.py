"""Triton kernel of the GDN short convolution (launcher in ``conv.py``)."""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def short_conv_kernel(
    x_ptr,
    w_ptr,
    state_ptr,
    wr_ptr,
    out_ptr,
    steps,
    channels,
    block_size,
    stride_xt,
    stride_wc,
    stride_sc,
    stride_wrc,
    stride_ot,
    KERNEL: tl.constexpr,
    RIGHT_KERNEL: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One [BLOCK_T, BLOCK_C] tile: causal taps (rows before the input come from the state, which is
    only read), then the block-local right taps, then SiLU, all in float32."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_ok = t < steps
    c_ok = c < channels
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for i in tl.static_range(KERNEL):
        src = t - (KERNEL - 1) + i  # the row tap i reads; negative: the state's column K-1+src
        w = tl.load(w_ptr + c * stride_wc + i, mask=c_ok, other=0.0).to(tl.float32)
        from_x = tl.load(
            x_ptr + src[:, None] * stride_xt + c[None, :],
            mask=((src >= 0) & t_ok)[:, None] & c_ok[None, :],
            other=0.0,
        )
        from_state = tl.load(
            state_ptr + c[None, :] * stride_sc + (KERNEL - 1 + src)[:, None],
            mask=((src < 0) & t_ok)[:, None] & c_ok[None, :],
            other=0.0,
        )
        acc += w[None, :] * (from_x.to(tl.float32) + from_state.to(tl.float32))
    if RIGHT_KERNEL > 0:
        block_end = (t // block_size + 1) * block_size
        for j in tl.static_range(RIGHT_KERNEL):
            src = t + 1 + j
            w = tl.load(wr_ptr + c * stride_wrc + j, mask=c_ok, other=0.0).to(tl.float32)
            ahead = tl.load(
                x_ptr + src[:, None] * stride_xt + c[None, :],
                mask=((src < steps) & (src < block_end))[:, None] & c_ok[None, :],
                other=0.0,
            )
            acc += w[None, :] * ahead.to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        out_ptr + t[:, None] * stride_ot + c[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=t_ok[:, None] & c_ok[None, :],
    )
