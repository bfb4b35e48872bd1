"""Launchers of the gated delta rule kernels: the fused recurrent kernel for decoding steps (up to
``RECURRENT_MAX_STEPS`` tokens), the chunked kernels for prompt prefill, and the mix + gated norm
epilogue. No host read-back anywhere: a CUDA graph can hold every call for a fixed T.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import torch
import triton

from clover_agent.kernels.gated_delta_rule import triton_kernels as tk
from clover_agent.kernels.norms.norms import gdn_output

#: Longest input the step-by-step kernel takes under ``method="auto"`` (a fused 64-token step).
RECURRENT_MAX_STEPS = 64
#: Chunk of the chunked kernels (a multiple of 16 for ``tl.dot``).
CHUNK = 32
#: State columns per program of the recurrent kernel, and its warps: flash-linear-attention's launch
#: shape. One warp per program reduces over the key dimension with shuffles, no block-wide
#: barrier inside a time step (four warps waited on 14); eight columns keep its [128, 8] state
#: slice in 32 registers a thread, and give the decoding steps 16 x 32 x 2 = 1,024 programs.
RECURRENT_BLOCK_V = 8
RECURRENT_WARPS = 1
#: State columns per program of the chunk scan, and its warps. With bf16 operands at sm_90, eight
#: warps over 16 columns fit the registers (172 a thread, no spill) and give Clover's 32 value heads
#: 256 programs; 32 columns spilled 24 bytes a thread, and four warps spilled at every width
#: (tests/kernels/test_hopper_compile.py holds the no-spill part).
SCAN_BLOCK_V = 16
SCAN_WARPS = 8

Method = Literal["auto", "recurrent", "chunk"]


class _ScanOptions(TypedDict):
    """The keyword arguments both halves of a split :func:`_scan` share."""

    block_size: int | None
    normalize_qk: bool
    method: Method


#: How the chunked kernels' matrix products take their operands, by the model's dtype: a
#: half-precision model's on the tensor cores in its own type (float32 sums, as
#: flash-linear-attention does), a float32 model's exactly (no TF32), so a float32 run checks the
#: same arithmetic as the reference.
_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def chunk_precision(dtype: torch.dtype) -> str:
    """The chunked kernels' ``PRECISION`` for inputs of ``dtype`` (see ``triton_kernels``)."""
    return _PRECISION.get(dtype, "ieee")


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A GDN layer's gates in one launch (contract of :func:`reference.gdn_gates`): a, b [T, Hv]
    (rows may be strided views of a projection), A_log and dt_bias [Hv]; returns g float32 [T, Hv]
    and beta [T, Hv] in b's dtype."""
    tokens, heads = a.shape
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1:
        b = b.contiguous()
    g = torch.empty(tokens, heads, dtype=torch.float32, device=a.device)
    beta = torch.empty(tokens, heads, dtype=b.dtype, device=b.device)
    if tokens:
        tk.gates_kernel[(tokens,)](
            a, b, a_log, dt_bias, g, beta, heads, a.stride(0), b.stride(0), g.stride(0), beta.stride(0),
            BLOCK_H=max(16, triton.next_power_of_2(heads)),
        )  # fmt: skip
    return g, beta


def _inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v with unit stride in the head dimension, g/beta with unit stride over heads (views kept)."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    g, beta = (t if t.stride(-1) == 1 else t.contiguous() for t in (g, beta))
    if v.shape[1] % k.shape[1] or q.shape != k.shape:
        raise ValueError(
            f"gated delta rule shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    return q, k, v, g, beta


def _scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    *,
    store_at: int,
    state_out: torch.Tensor | None,
    block_size: int | None,
    normalize_qk: bool,
    method: Method,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward scan outputs (and, with ``block_size``, the backward in-block scan's) as float32
    [1 or 2, T, Hv, Dv], and the state after ``store_at`` tokens written to ``state_out``."""
    q, k, v, g, beta = _inputs(q, k, v, g, beta)
    steps, key_heads, head_k = k.shape
    value_heads, head_v = v.shape[1], v.shape[2]
    directions = 2 if block_size is not None else 1
    if method == "auto":
        method = "recurrent" if steps <= RECURRENT_MAX_STEPS else "chunk"
    out = torch.empty(directions, steps, value_heads, head_v, dtype=torch.float32, device=v.device)
    if steps == 0:
        return out, state_out
    state = state if state.is_contiguous() else state.contiguous()
    if state_out is None:
        state_out = torch.empty_like(state, dtype=torch.float32) if store_at else state
    shape = {"GROUP": value_heads // key_heads, "HEAD_K": head_k, "HEAD_V": head_v, "NORMALIZE": normalize_qk}
    strides = (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        beta.stride(0),
    )
    block_k = max(16, triton.next_power_of_2(head_k))
    if method == "recurrent":
        block_v = min(RECURRENT_BLOCK_V, triton.next_power_of_2(head_v))
        tk.recurrent_kernel[(value_heads, triton.cdiv(head_v, block_v), directions)](
            q,
            k,
            v,
            g,
            beta,
            state,
            out,
            state_out,
            steps,
            block_size or steps,
            store_at,
            scale,
            *strides,
            *out.stride()[:3],
            **shape,
            BLOCK_K=block_k,
            BLOCK_V=block_v,
            num_warps=RECURRENT_WARPS,
        )
        return out, state_out
    if 0 < store_at < steps:  # the state in the middle: two scans, the second from the first's state
        options: _ScanOptions = {"block_size": None, "normalize_qk": normalize_qk, "method": method}
        first = (q[:store_at], k[:store_at], v[:store_at], g[:store_at], beta[:store_at])
        head, state_out = _scan(*first, state, scale, store_at=store_at, state_out=state_out, **options)
        assert state_out is not None  # a non-empty scan writes its state
        second = (q[store_at:], k[store_at:], v[store_at:], g[store_at:], beta[store_at:])
        tail, _ = _scan(*second, state_out, scale, store_at=0, state_out=None, **options)
        out[0, :store_at], out[0, store_at:] = head[0], tail[0]
    else:
        _chunk_forward(
            q, k, v, g, beta, state, scale, out[0], state_out, store_at == steps, strides, shape, block_k
        )
    if block_size is not None:
        _chunk_local(q, k, v, g, beta, scale, out[1], block_size, strides, shape, block_k)
    return out, state_out


def _chunk_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    state_out: torch.Tensor,
    store: bool,
    strides: tuple[int, ...],
    shape: dict[str, int],
    block_k: int,
) -> None:
    steps, value_heads, head_v = v.shape
    precision = chunk_precision(q.dtype)
    # Between the two kernels a half-precision model's w and u are kept in its own type, as
    # flash-linear-attention keeps them (half the traffic; w is rounded to it for its product
    # anyway); a float32 model's stay exact.
    between = torch.float32 if precision == "ieee" else q.dtype
    w = torch.empty(steps, value_heads, k.shape[2], dtype=between, device=v.device)
    u = torch.empty(steps, value_heads, head_v, dtype=between, device=v.device)
    tk.chunk_prepare_kernel[(triton.cdiv(steps, CHUNK), value_heads)](
        q,
        k,
        v,
        g,
        beta,
        w,
        u,
        steps,
        CHUNK,
        scale,
        *strides,
        *w.stride()[:2],
        *u.stride()[:2],
        **shape,
        LOCAL=False,
        BLOCK_T=CHUNK,
        BLOCK_K=block_k,
        BLOCK_V=max(16, triton.next_power_of_2(head_v)),
        PRECISION=precision,
    )
    block_v = min(SCAN_BLOCK_V, max(16, triton.next_power_of_2(head_v)))
    q_k_g = (strides[0], strides[1], strides[2], strides[3], strides[6])
    tk.chunk_scan_kernel[(value_heads, triton.cdiv(head_v, block_v))](
        q,
        k,
        g,
        w,
        u,
        state,
        out,
        state_out,
        steps,
        scale,
        *q_k_g,
        *w.stride()[:2],
        *u.stride()[:2],
        *out.stride()[:2],
        **shape,
        STORE=store,
        BLOCK_T=CHUNK,
        BLOCK_K=block_k,
        BLOCK_V=block_v,
        PRECISION=precision,
        num_warps=SCAN_WARPS,
    )


def _chunk_local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    block_size: int,
    strides: tuple[int, ...],
    shape: dict[str, int],
    block_k: int,
) -> None:
    """The backward branch of every block at once: each block reversed, from a zero state."""
    steps, value_heads, head_v = v.shape
    tk.chunk_prepare_kernel[(triton.cdiv(steps, block_size), value_heads)](
        q,
        k,
        v,
        g,
        beta,
        out,
        out,
        steps,
        block_size,
        scale,
        *strides,
        *out.stride()[:2],
        *out.stride()[:2],
        **shape,
        LOCAL=True,
        BLOCK_T=max(16, triton.next_power_of_2(block_size)),
        BLOCK_K=block_k,
        BLOCK_V=max(16, triton.next_power_of_2(head_v)),
        PRECISION=chunk_precision(q.dtype),
    )


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    *,
    method: Method = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of ``ops.gated_delta_rule`` (:func:`reference.gated_delta_rule`): q, k [T, Hk, Dk]
    (normalised), v [T, Hv, Dv], g, beta [T, Hv], state [Hv, Dk, Dv] read-only; returns new
    (outputs [T, Hv, Dv], final state) tensors, float32. ``method``: the step-by-step kernel, the
    chunked one, or ``"auto"`` (step by step up to 64 tokens)."""
    steps = q.shape[0]
    out, final = _scan(
        q,
        k,
        v,
        g,
        beta,
        state,
        scale,
        store_at=steps,
        state_out=None,
        block_size=None,
        normalize_qk=False,
        method=method,
    )
    if steps:
        assert final is not None  # a non-empty scan writes its state
    else:
        final = state.float().clone()
    return out[0], final


def gated_delta_net(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    z: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    commit: int = 0,
    block_size: int | None = None,
    mix_logits: torch.Tensor | None = None,
    normalize_qk: bool = False,
    state_out: torch.Tensor | None = None,
    method: Method = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Contract of :func:`reference.gated_delta_net` (the GDN layer's core after the short conv).

    Shapes: q, k [T, Hk, Dk]; v, z [T, Hv, Dv]; g, beta [T, Hv]; any strides with a unit last one (views
    of the conv output are fine). Returns ``(out [T, Hv, Dv] in z's dtype, the committed state or None)``.

    - ``state`` [Hv, Dk, Dv] float32: only read.
    - ``commit`` > 0: the state after ``commit`` tokens is written to ``state_out`` and returned.
    - ``state_out``: a new tensor when None; it may be ``state`` itself (every program reads its slice
      of the state before writing it).
    - ``mix_logits`` [Hv, 2] with ``block_size``: adds the in-block backward branch.

    Two launches up to 64 tokens (both scans in one, then the mix + norm epilogue); the chunked path
    adds one per kind of pass.
    """
    if mix_logits is not None and block_size is None:
        raise ValueError("the bidirectional branch needs block_size")
    if not 0 <= commit <= q.shape[0]:
        raise ValueError(f"commit must be in [0, {q.shape[0]}], got {commit}")
    scans, committed = _scan(
        q,
        k,
        v,
        g,
        beta,
        state,
        scale,
        store_at=commit,
        state_out=state_out,
        block_size=block_size if mix_logits is not None else None,
        normalize_qk=normalize_qk,
        method=method,
    )
    backward = scans[1] if mix_logits is not None else None
    out = gdn_output(scans[0], z, norm_weight, eps, backward, mix_logits)
    return out, (committed if commit else None)
