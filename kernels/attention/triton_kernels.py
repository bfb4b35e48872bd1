"""Triton kernels of the block-causal attention over the K/V cache (launchers in ``kv_attention.py``).

The committed length is read from device memory, so one compiled launch serves every context
length (a CUDA graph replays it as the cache grows). Grouped-query attention without repeating
K/V: a program's rows are (token, query head) pairs of one K/V head, row ``r`` = token ``r // G``,
head ``kv_head * G + r % G``. Split-K (flash decoding): the key range is cut into ``SPLITS`` equal
parts, each program keeps an online softmax over its part and writes a normalised partial output
and its log-sum-exp; the combine kernel merges the parts in order (deterministic) and applies the
output gate.
"""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def write_kv_kernel(
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    length_ptr,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_kc,
    stride_kch,
    stride_vc,
    stride_vch,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Row t, head h of the new K/V to cache row length + t."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    row = (tl.load(length_ptr) + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < HEAD_DIM
    k = tl.load(k_new_ptr + t * stride_kn + h * stride_kh + d, mask=ok)
    v = tl.load(v_new_ptr + t * stride_vn + h * stride_vh + d, mask=ok)
    tl.store(k_cache_ptr + row * stride_kc + h * stride_kch + d, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + row * stride_vc + h * stride_vch + d, v.to(v_cache_ptr.dtype.element_ty), mask=ok)


@triton.jit
def attention_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    length_ptr,
    part_ptr,
    lse_ptr,
    steps,
    block_size,
    scale,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One tile of (token, head) rows of one K/V head over one part of the keys."""
    tiles = tl.cdiv(steps * GROUP, BLOCK_M)
    kv_head = tl.program_id(0) // tiles
    rows = (tl.program_id(0) % tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < steps * GROUP
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    length = tl.load(length_ptr)
    total = length + steps
    # key j is visible to the row's query at position p when j // block_size <= p // block_size
    limit = tl.minimum(((length + token) // block_size + 1) * block_size, total)
    limit = tl.where(row_ok, limit, 0)
    part = tl.cdiv(tl.cdiv(total, SPLITS), BLOCK_N) * BLOCK_N
    first = split * part
    last = tl.minimum(first + part, tl.max(limit, 0))

    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    total_p = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for start in range(first, last, BLOCK_N):
        keys = start + cols
        key_ok = keys < last
        k = tl.load(
            k_ptr + keys[:, None].to(tl.int64) * stride_kn + kv_head * stride_kh + d[None, :],
            mask=key_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        v = tl.load(
            v_ptr + keys[:, None].to(tl.int64) * stride_vn + kv_head * stride_vh + d[None, :],
            mask=key_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(keys[None, :] < limit[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        total_p = total_p * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    seen = total_p > 0.0
    out = acc / tl.where(seen, total_p, 1.0)[:, None]
    lse = tl.where(seen, m + tl.log(tl.where(seen, total_p, 1.0)), float("-inf"))
    tl.store(
        part_ptr + split * stride_ps + token[:, None] * stride_pt + head[:, None] * stride_ph + d[None, :],
        out,
        mask=row_ok[:, None] & d_ok[None, :],
    )
    tl.store(lse_ptr + split * stride_ls + token * stride_lt + head, lse, mask=row_ok)


@triton.jit
def attention_combine_kernel(
    part_ptr,
    lse_ptr,
    gate_ptr,
    out_ptr,
    heads,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_gt,
    stride_gh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    HAS_GATE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[t, h] = sum_s w_s part_s / sum_s w_s with w_s = exp(lse_s - max lse), times sigmoid(gate)."""
    t = tl.program_id(0) // heads
    h = tl.program_id(0) % heads
    s = tl.arange(0, BLOCK_S)
    s_ok = s < SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    lse = tl.load(lse_ptr + s * stride_ls + t * stride_lt + h, mask=s_ok, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, 0))
    parts = tl.load(
        part_ptr + s[:, None] * stride_ps + t * stride_pt + h * stride_ph + d[None, :],
        mask=(s_ok & (lse > float("-inf")))[:, None] & d_ok[None, :],
        other=0.0,
    )
    out = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    if HAS_GATE:
        gate = tl.load(gate_ptr + t * stride_gt + h * stride_gh + d, mask=d_ok, other=0.0).to(tl.float32)
        out = out * tl.sigmoid(gate)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
