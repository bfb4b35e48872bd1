"""Triton kernels of the gated delta rule (launchers in ``gdn.py``).

``recurrent_kernel`` runs step by step, for short inputs: the forward scan from the committed state
and Clover's in-block backward branch in one launch. ``chunk_prepare_kernel`` and
``chunk_scan_kernel`` are the chunked (WY) form for prompt prefill. Each kernel's comment says how
it splits the work. Arithmetic is float32. ``PRECISION`` says how the chunked kernels' matrix
products take their operands: ``"ieee"`` (or ``"tf32"``) is ``tl.dot``'s input precision on float32
operands; ``"bf16"`` and ``"fp16"`` round the operands to that half type for the tensor cores (as
flash-linear-attention's chunked kernels do), the sums staying float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` with float32 sums; operands rounded to ``PRECISION``'s half type (see the module)."""
    if PRECISION == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PRECISION == "fp16":
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _load_qk(ptr, rows, ok, cols, cols_ok, stride_t, NORMALIZE: tl.constexpr):
    """Rows of q or k [len(rows), BLOCK_K] in float32, L2-normalised (eps 1e-6) with NORMALIZE."""
    x = tl.load(
        ptr + rows[:, None] * stride_t + cols[None, :], mask=ok[:, None] & cols_ok[None, :], other=0.0
    )
    x = x.to(tl.float32)
    if NORMALIZE:
        x = x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    return x


@triton.jit
def gates_kernel(
    a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, heads, stride_a, stride_b, stride_g, stride_beta,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    """One token's gates: g = -exp(A_log) * softplus(a + dt_bias) (float32; softplus is x above 20,
    as PyTorch's), beta = sigmoid(b) rounded to beta's dtype."""
    t = tl.program_id(0).to(tl.int64)
    hs = tl.arange(0, BLOCK_H)
    ok = hs < heads
    a = tl.load(a_ptr + t * stride_a + hs, mask=ok, other=0.0).to(tl.float32)
    x = a + tl.load(dt_bias_ptr + hs, mask=ok, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(tl.load(a_log_ptr + hs, mask=ok, other=0.0).to(tl.float32)) * softplus
    tl.store(g_ptr + t * stride_g + hs, g, mask=ok)
    b = tl.load(b_ptr + t * stride_b + hs, mask=ok, other=0.0).to(tl.float32)
    tl.store(beta_ptr + t * stride_beta + hs, tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=ok)


# Step by step, for blocks of up to 64 tokens. One program per (value head, column block of the
# state, direction): direction 0 scans left to right from the committed state (only read; the state
# after ``store_at`` tokens goes to ``state_out``), direction 1 scans each block right to left from a
# zero state (Clover's in-block backward branch). The delta rule is independent per state column, so
# splitting the value dimension gives parallelism for free.
@triton.jit
def recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    state_ptr,
    out_ptr,
    state_out_ptr,
    steps,
    block_size,
    store_at,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_od,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    h = tl.program_id(0)
    direction = tl.program_id(2)
    hk = h // GROUP
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ks < HEAD_K
    v_ok = vs < HEAD_V
    state_offs = h.to(tl.int64) * HEAD_K * HEAD_V + ks[:, None] * HEAD_V + vs[None, :]
    state_mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(state_ptr + state_offs, mask=state_mask, other=0.0).to(tl.float32)
    s = tl.where(direction == 0, s, 0.0)  # the backward branch starts each block from zero
    for i in range(steps):
        start = i // block_size * block_size
        last = tl.minimum(start + block_size, steps) - 1
        t = tl.where(direction == 0, i, last - (i - start))
        s = tl.where((direction != 0) & (i == start), 0.0, s)
        q = tl.load(q_ptr + t * stride_qt + hk * stride_qh + ks, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_kt + hk * stride_kh + ks, mask=k_ok, other=0.0).to(tl.float32)
        if NORMALIZE:
            q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + vs, mask=v_ok, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + t * stride_gt + h).to(tl.float32))
        beta = tl.load(beta_ptr + t * stride_bt + h).to(tl.float32)
        s = s * decay
        u = beta * (v - tl.sum(s * k[:, None], 0))
        s = s + k[:, None] * u[None, :]
        o = tl.sum(s * q[:, None], 0) * scale
        tl.store(out_ptr + direction * stride_od + t * stride_ot + h * stride_oh + vs, o, mask=v_ok)
        if (direction == 0) & (i + 1 == store_at):
            tl.store(state_out_ptr + state_offs, s, mask=state_mask)


# The chunked (WY) form, first half. Per chunk, ``(I + A) U = beta V - (beta Γ K) S0`` with
# ``A[t, s] = beta_t Γ_t/Γ_s k_t·k_s`` for s < t: this kernel inverts the unit lower triangular
# ``I + A`` by forward substitution (all chunks in parallel) and stores ``W = (I+A)^-1 beta Γ K`` and
# ``U0 = (I+A)^-1 beta V``. With ``LOCAL`` it instead runs each block reversed from a zero state and
# writes its outputs directly (the backward branch needs no state, so it is fully parallel).
@triton.jit
def chunk_prepare_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    w_ptr,
    u_ptr,
    steps,
    segment,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_wt,
    stride_wh,
    stride_ut,
    stride_uh,
    GROUP: tl.constexpr,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    NORMALIZE: tl.constexpr,
    LOCAL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One segment (a chunk, or with LOCAL a block read in reverse) of one value head."""
    start = tl.program_id(0) * segment
    h = tl.program_id(1)
    hk = h // GROUP
    length = tl.minimum(segment, steps - start)
    i = tl.arange(0, BLOCK_T)
    ok = i < length
    t = tl.where(ok, start + i, 0)
    if LOCAL:
        t = tl.where(ok, start + length - 1 - i, 0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < HEAD_K
    vs = tl.arange(0, BLOCK_V)
    v_ok = vs < HEAD_V
    k = _load_qk(k_ptr + hk * stride_kh, t, ok, ks, k_ok, stride_kt, NORMALIZE)
    v = tl.load(
        v_ptr + t[:, None] * stride_vt + h * stride_vh + vs[None, :],
        mask=ok[:, None] & v_ok[None, :],
        other=0.0,
    )
    g = tl.load(g_ptr + t * stride_gt + h, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + t * stride_bt + h, mask=ok, other=0.0).to(tl.float32)
    log_decay = tl.cumsum(g, 0)
    lower = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(lower, log_decay[:, None] - log_decay[None, :], float("-inf")))
    kk = _dot(k, tl.trans(k), PRECISION)
    a = tl.where(i[:, None] > i[None, :], beta[:, None] * kk * decay, 0.0)
    # (I + a)^-1 by forward substitution: row r = e_r - a[r, :] @ inverse (rows < r final already)
    inverse = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    for r in range(1, BLOCK_T):
        a_r = tl.sum(tl.where(i[:, None] == r, a, 0.0), 0)
        row = tl.where(i == r, 1.0, 0.0) - tl.sum(a_r[:, None] * inverse, 0)
        inverse = tl.where(i[:, None] == r, row[None, :], inverse)
    u = _dot(inverse, v.to(tl.float32) * beta[:, None], PRECISION)
    if LOCAL:
        q = _load_qk(q_ptr + hk * stride_qh, t, ok, ks, k_ok, stride_qt, NORMALIZE)
        qk = _dot(q, tl.trans(k), PRECISION) * decay
        o = _dot(qk, u, PRECISION) * scale
        tl.store(
            u_ptr + t[:, None] * stride_ut + h * stride_uh + vs[None, :], o, mask=ok[:, None] & v_ok[None, :]
        )
    else:
        w = _dot(inverse, k * (beta * tl.exp(log_decay))[:, None], PRECISION)
        tl.store(
            w_ptr + t[:, None] * stride_wt + h * stride_wh + ks[None, :], w, mask=ok[:, None] & k_ok[None, :]
        )
        tl.store(
            u_ptr + t[:, None] * stride_ut + h * stride_uh + vs[None, :], u, mask=ok[:, None] & v_ok[None, :]
        )


# The chunked form, second half: walks the chunks in order with the state in registers.
@triton.jit
def chunk_scan_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    w_ptr,
    u_ptr,
    state_ptr,
    out_ptr,
    state_out_ptr,
    steps,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_gt,
    stride_wt,
    stride_wh,
    stride_ut,
    stride_uh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    NORMALIZE: tl.constexpr,
    STORE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The chunks of one (value head, state column block) in order: outputs, and the final state."""
    h = tl.program_id(0)
    hk = h // GROUP
    i = tl.arange(0, BLOCK_T)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < HEAD_K
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = vs < HEAD_V
    state_offs = h.to(tl.int64) * HEAD_K * HEAD_V + ks[:, None] * HEAD_V + vs[None, :]
    state_mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(state_ptr + state_offs, mask=state_mask, other=0.0).to(tl.float32)
    lower = i[:, None] >= i[None, :]
    for start in range(0, steps, BLOCK_T):
        t = start + i
        ok = t < steps
        q = _load_qk(q_ptr + hk * stride_qh, t, ok, ks, k_ok, stride_qt, NORMALIZE)
        k = _load_qk(k_ptr + hk * stride_kh, t, ok, ks, k_ok, stride_kt, NORMALIZE)
        g = tl.load(g_ptr + t * stride_gt + h, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + t[:, None] * stride_wt + h * stride_wh + ks[None, :],
            mask=ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        u = tl.load(
            u_ptr + t[:, None] * stride_ut + h * stride_uh + vs[None, :],
            mask=ok[:, None] & v_ok[None, :],
            other=0.0,
        )
        log_decay = tl.cumsum(g, 0)
        total = tl.sum(g, 0)
        u = u - _dot(w, s, PRECISION)
        qk = _dot(q, tl.trans(k), PRECISION)
        qk = qk * tl.exp(tl.where(lower, log_decay[:, None] - log_decay[None, :], float("-inf")))
        o = _dot(q * tl.exp(log_decay)[:, None], s, PRECISION)
        o = (o + _dot(qk, u, PRECISION)) * scale
        tl.store(
            out_ptr + t[:, None] * stride_ot + h * stride_oh + vs[None, :],
            o,
            mask=ok[:, None] & v_ok[None, :],
        )
        k_to_end = k * tl.exp(total - log_decay)[:, None]
        s = s * tl.exp(total) + _dot(tl.trans(k_to_end), u, PRECISION)
    if STORE:
        tl.store(state_out_ptr + state_offs, s, mask=state_mask)
