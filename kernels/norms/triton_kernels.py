"""Triton kernels of the RMS norms (launchers in ``norms.py``): one program per row, float32 math."""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, size, stride_x, stride_o, eps, BLOCK_D: tl.constexpr):
    """out = x / rms(x) * (1 + w) for one row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < size
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / size + eps)
    tl.store(out_ptr + row * stride_o + cols, (normed * (1.0 + w)).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def rms_norm_rotary_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, size, heads, rot, stride_xt, stride_xh, stride_c, stride_s,
    stride_ot, stride_oh, eps, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One head row: n = x / rms(x) * (1 + w) rounded to the dtype, then the rotary embedding over
    its first ``rot`` dims (dim i pairs with i + rot/2), float32 inside, one rounding at the end."""
    row = tl.program_id(0)
    t = (row // heads).to(tl.int64)
    h = (row % heads).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < size
    base = x_ptr + t * stride_xt + h * stride_xh
    x = tl.load(base + cols, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, 0) / size + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = (x * inv * (1.0 + w)).to(out_ptr.dtype.element_ty).to(tl.float32)
    half = rot // 2
    rotating = cols < rot
    partner = tl.where(cols < half, cols + half, cols - half)
    px = tl.load(base + partner, mask=rotating, other=0.0).to(tl.float32)
    pw = tl.load(w_ptr + partner, mask=rotating, other=0.0).to(tl.float32)
    paired = (px * inv * (1.0 + pw)).to(out_ptr.dtype.element_ty).to(tl.float32)
    turned = tl.where(cols < half, -paired, paired)
    cos = tl.load(cos_ptr + t * stride_c + cols, mask=rotating, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_s + cols, mask=rotating, other=0.0).to(tl.float32)
    out = tl.where(rotating, normed * cos + turned * sin, normed)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def add_rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, sum_ptr, out_ptr, size, stride_x, stride_d, stride_s, stride_o, eps,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """sum = x + d (rounded to its dtype, as PyTorch's add), out = sum / rms(sum) * (1 + w): one row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < size
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    total = (x + d).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * stride_s + cols, total, mask=ok)
    t = total.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = t * tl.rsqrt(tl.sum(t * t, 0) / size + eps)
    tl.store(out_ptr + row * stride_o + cols, (normed * (1.0 + w)).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def gated_norm_kernel(
    x_ptr,
    x2_ptr,
    mix_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    size,
    heads,
    stride_x,
    stride_x2,
    stride_g,
    stride_o,
    eps,
    MIX: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out = w * n(x) * silu(gate) for one row (one head of one token), n = x / rms(x); with MIX, x is
    first ``softmax(mix[h])[0] * x + softmax(mix[h])[1] * x2`` (h = row % heads)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < size
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if MIX:
        head = row % heads
        a = tl.load(mix_ptr + head * 2).to(tl.float32)
        b = tl.load(mix_ptr + head * 2 + 1).to(tl.float32)
        top = tl.maximum(a, b)
        wa = tl.exp(a - top)
        wb = tl.exp(b - top)
        x2 = tl.load(x2_ptr + row * stride_x2 + cols, mask=ok, other=0.0).to(tl.float32)
        x = (wa * x + wb * x2) / (wa + wb)
    gate = tl.load(gate_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / size + eps)
    out = w * normed * gate * tl.sigmoid(gate)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)
