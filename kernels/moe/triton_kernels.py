"""Triton kernels of the fused MoE (launchers in ``fused_moe.py``).

Pairs are (token, slot) entries of the routing, numbered ``n * TOP_K + j``. The alignment kernel
groups them by expert in tiles of BLOCK_M rows; the two grouped GEMMs run one program per
(tile, column block) over a fixed worst-case grid and return at once for tiles past the used
length, which they read from device memory (no host read-back, so a CUDA graph can hold them).
Both GEMMs read expert weights stored plain, FP8 or INT4 (``QUANT``; formats in ``quant.py``) and
dequantise each weight tile in the K loop to the activations' dtype (w8a16 / w4a16).
"""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def route_kernel(
    logits_ptr,
    ids_ptr,
    weights_ptr,
    num_experts,
    stride_n,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """One token: float32 softmax over experts, top-k (lowest index on ties), renormalised."""
    n = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    valid = offs < num_experts
    z = tl.load(logits_ptr + n * stride_n + offs, mask=valid, other=float("-inf")).to(tl.float32)
    e = tl.exp(z - tl.max(z, 0))
    p = tl.where(valid, e / tl.sum(e, 0), -1.0)
    slots = tl.arange(0, BLOCK_K)
    top_p = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, 0)
        idx = tl.min(tl.where(p == best, offs, BLOCK_E), 0)
        top_p = tl.where(slots == j, best, top_p)
        top_i = tl.where(slots == j, idx.to(tl.int64), top_i)
        p = tl.where(offs == idx, -1.0, p)
    top_p = top_p / tl.sum(top_p, 0)  # slots past TOP_K hold 0
    keep = slots < TOP_K
    tl.store(ids_ptr + n * TOP_K + slots, top_i, mask=keep)
    tl.store(weights_ptr + n * TOP_K + slots, top_p.to(weights_ptr.dtype.element_ty), mask=keep)


@triton.jit
def align_kernel(
    ids_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    num_experts,
    BLOCK_M: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Program e: count every expert's pairs, place expert e's pairs (in pair order) at its padded
    offset, fill its padding slots with ``num_pairs`` and name it as the expert of its tiles."""
    e = tl.program_id(0)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, num_pairs, BLOCK_P):
        offs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=0).to(tl.int32)
        counts += tl.histogram(ids, BLOCK_E, mask=offs < num_pairs)
    experts = tl.arange(0, BLOCK_E)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(experts < e, padded, 0), 0)
    count = tl.sum(tl.where(experts == e, counts, 0), 0)
    mine = tl.sum(tl.where(experts == e, padded, 0), 0)
    if e == 0:
        tl.store(num_padded_ptr, tl.sum(tl.where(experts < num_experts, padded, 0), 0))
    placed = 0
    for p0 in range(0, num_pairs, BLOCK_P):
        offs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1).to(tl.int32)
        match = (ids == e).to(tl.int32)
        rank = placed + tl.cumsum(match, 0) - 1
        tl.store(sorted_pairs_ptr + start + rank, offs.to(tl.int32), mask=match > 0)
        placed += tl.sum(match, 0)
    pad = count + tl.arange(0, BLOCK_M)
    tl.store(sorted_pairs_ptr + start + pad, num_pairs, mask=pad < mine)
    for b0 in range(0, mine // BLOCK_M, BLOCK_P):
        blocks = b0 + tl.arange(0, BLOCK_P)
        tl.store(block_experts_ptr + start // BLOCK_M + blocks, e, mask=blocks < mine // BLOCK_M)


@triton.jit
def weight_tile(
    row_ptrs,
    scale_ptrs,
    k0,
    ks,
    k_limit,
    row_ok,
    stride_wk,
    stride_sk,
    QUANT: tl.constexpr,
    SCALE_K: tl.constexpr,
):
    """[BLOCK_K, BLOCK_N] tile of W^T: inputs k0 + ks of the rows at ``row_ptrs`` ([BLOCK_N]
    pointers), dequantised with the scales at ``scale_ptrs`` (one per row for this K block, as
    BLOCK_K divides SCALE_K). "fp8": e4m3 * scale; "int4": (nibble - 8) * scale, two per byte
    along K (even k low); "none": as stored."""
    k = k0 + ks
    mask = (k < k_limit)[:, None] & row_ok[None, :]
    if QUANT == "int4":
        packed = tl.load(row_ptrs[None, :] + (k // 2)[:, None] * stride_wk, mask=mask, other=0)
        w = ((packed.to(tl.int32) >> ((k % 2) * 4)[:, None]) & 0xF) - 8
    else:
        w = tl.load(row_ptrs[None, :] + k[:, None] * stride_wk, mask=mask, other=0.0)
    if QUANT != "none":
        scale = tl.load(scale_ptrs + (k0 // SCALE_K) * stride_sk, mask=row_ok, other=0.0)
        w = w.to(tl.float32) * scale.to(tl.float32)[None, :]
    return w


@triton.jit
def gate_up_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    hidden,
    inner,
    stride_xn,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_sk,
    stride_on,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
):
    """out[pair, n] = silu(x[token] . gate_e[n]) * (x[token] . up_e[n]) for one tile of an expert's
    pairs. Quantised gate and up rows each have their own scale grid (gate's first)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    rows = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inner
    ks = tl.arange(0, BLOCK_K)
    gate_rows = w_ptr + expert * stride_we + cols * stride_wn
    up_rows = gate_rows + inner * stride_wn
    gate_scales = scale_ptr + expert * stride_se + (cols // SCALE_N) * stride_sn
    up_scales = gate_scales + tl.cdiv(inner, SCALE_N) * stride_sn
    x_ptrs = x_ptr + tokens[:, None] * stride_xn + ks[None, :]
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + ks) < hidden
        a = tl.load(x_ptrs + k0, mask=rows[:, None] & k_ok[None, :], other=0.0)
        wg = weight_tile(gate_rows, gate_scales, k0, ks, hidden, col_ok, stride_wk, stride_sk, QUANT, SCALE_K)
        wu = weight_tile(up_rows, up_scales, k0, ks, hidden, col_ok, stride_wk, stride_sk, QUANT, SCALE_K)
        acc_gate = tl.dot(a, wg.to(a.dtype), acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, wu.to(a.dtype), acc_up, input_precision=PRECISION)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * stride_on + cols[None, :]
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=rows[:, None] & col_ok[None, :])


@triton.jit
def down_kernel(
    h_ptr,
    w_ptr,
    scale_ptr,
    weights_ptr,
    out_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    hidden,
    inner,
    stride_hn,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_sk,
    stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
):
    """out[pair, n] = w[pair] * (h[pair] . down_e[n]) for one tile of an expert's pairs."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    rows = pairs < num_pairs
    pairs64 = pairs.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    ks = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + expert * stride_we + cols * stride_wn
    w_scales = scale_ptr + expert * stride_se + (cols // SCALE_N) * stride_sn
    h_ptrs = h_ptr + pairs64[:, None] * stride_hn + ks[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inner, BLOCK_K):
        k_ok = (k0 + ks) < inner
        a = tl.load(h_ptrs + k0, mask=rows[:, None] & k_ok[None, :], other=0.0)
        w = weight_tile(w_rows, w_scales, k0, ks, inner, col_ok, stride_wk, stride_sk, QUANT, SCALE_K)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
    weight = tl.load(weights_ptr + pairs64, mask=rows, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    out_ptrs = out_ptr + pairs64[:, None] * stride_on + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=rows[:, None] & col_ok[None, :])


@triton.jit
def combine_kernel(
    pair_out_ptr,
    shared_ptr,
    shared_gate_ptr,
    residual_ptr,
    out_ptr,
    hidden,
    stride_pn,
    stride_sn,
    stride_gn,
    stride_rn,
    stride_on,
    TOP_K: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    HAS_SHARED_GATE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out[n] = residual[n] + sum_j pair_out[n*k + j] (j in order) + sigmoid(gate[n]) * shared[n]."""
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(pair_out_ptr + (n * TOP_K + j) * stride_pn + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_SHARED:
        shared = tl.load(shared_ptr + n * stride_sn + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_SHARED_GATE:
            shared = shared * tl.sigmoid(tl.load(shared_gate_ptr + n * stride_gn).to(tl.float32))
        acc += shared
    if HAS_RESIDUAL:
        acc += tl.load(residual_ptr + n * stride_rn + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + n * stride_on + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
