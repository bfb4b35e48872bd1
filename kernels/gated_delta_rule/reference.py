"""Plain-PyTorch reference of the Gated DeltaNet core: the gated delta rule (``ops.gated_delta_rule``),
Clover's in-block backward scan (``BidirectionalGdn.backward_scan``), and the layer's whole core
from q, k, v to the normed output (:func:`gated_delta_net`), in the order ``engine/model/gdn.py`` runs it.

Shapes use T tokens, Hk key heads, Hv value heads (a multiple of Hk), Dk / Dv head sizes. The
bidirectional layout: docs/bidirectional-gdn.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clover_agent.kernels.norms.reference import gdn_output

#: Sequence chunk of the chunked gated delta rule. Results do not depend on it beyond rounding; 32
#: (the diffusion block size) makes block-by-block decoding round like a full recompute.
DELTA_RULE_CHUNK = 32


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A GDN layer's per-head gates from its ``a`` and ``b`` projections [T, Hv]: the log decay
    ``g = -exp(A_log) * softplus(a + dt_bias)`` in float32 and the write strength
    ``beta = sigmoid(b)`` in b's dtype (as ``engine/model/gdn.py`` computes them)."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    *,
    final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over T steps from ``state``; returns (outputs, final state), both float32
    (the final state None with ``final_state=False``, which skips its update after the last chunk).

    q, k: [T, Hk, Dk] (already L2-normalised); v: [T, Hv, Dv]; g: [T, Hv] log-decay (<= 0);
    beta: [T, Hv]; state: [Hv, Dk, Dv], read-only. Value head h reads key head ``h // (Hv // Hk)``.
    Per step: ``S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = scale * S^T q``.

    Computed chunk by chunk: inside a chunk the delta-rule corrections solve a unit lower
    triangular system (the WY/UT form), so the sequential part is one small matmul per chunk.
    """
    steps, num_k_heads, _ = k.shape
    num_v_heads = v.shape[1]
    if num_v_heads != num_k_heads:
        q = q.repeat_interleave(num_v_heads // num_k_heads, dim=1)
        k = k.repeat_interleave(num_v_heads // num_k_heads, dim=1)
    # [H, T, D] in float32
    q, k, v = (t.float().transpose(0, 1) * s for t, s in ((q, scale), (k, 1.0), (v, 1.0)))
    g, beta = g.float().t(), beta.float().t()
    chunk = min(DELTA_RULE_CHUNK, max(steps, 1))
    pad = (-steps) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    heads, n_chunks = q.shape[0], (steps + pad) // chunk
    q, k, v = (t.reshape(heads, n_chunks, chunk, -1) for t in (q, k, v))
    g, beta = g.reshape(heads, n_chunks, chunk), beta.reshape(heads, n_chunks, chunk)

    # log Γ_t, the decay from the chunk start to t (inclusive). Strong gates make these sums large,
    # and the pairwise differences below would cancel away float32 digits, so the (small) decay
    # tables are built in float64.
    log_decay64 = g.double().cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # decay_ts = Γ_t / Γ_s for s <= t, else 0
    decay_ts = (
        (log_decay64.unsqueeze(-1) - log_decay64.unsqueeze(-2))
        .masked_fill(~causal, float("-inf"))
        .exp()
        .float()
    )
    chunk_total64 = log_decay64[..., -1:]  # log Γ_C
    log_decay = log_decay64.float()
    k_beta = k * beta.unsqueeze(-1)
    # (I + A) U = beta V - beta Γ K S0, with A[t, s] = beta_t Γ_t/Γ_s k_t·k_s for s < t (the diagonal
    # is never read: unitriangular). Both right-hand sides, beta V and beta Γ K, in one solve.
    system = (k_beta @ k.transpose(-1, -2)) * decay_ts
    decay = log_decay.exp().unsqueeze(-1)
    value_dim = v.shape[-1]
    solved = torch.linalg.solve_triangular(
        system, torch.cat([v * beta.unsqueeze(-1), k_beta * decay], dim=-1), upper=False, unitriangular=True
    )
    solve_v, solve_k = solved[..., :value_dim], solved[..., value_dim:]
    intra = (q @ k.transpose(-1, -2)) * decay_ts
    q_decayed = q * decay

    updates = n_chunks if final_state else n_chunks - 1  # state updates after a chunk
    if updates:
        chunk_decay = chunk_total64.float().exp().unsqueeze(-1)  # Γ_C per chunk, [H, n, 1, 1]
        k_to_end = k * (chunk_total64 - log_decay64).exp().float().unsqueeze(-1)

    # Per chunk, the two reads of the incoming state (by Γ K and by Γ Q) are one matmul.
    reads = torch.cat([solve_k, q_decayed], dim=-2)  # [H, n, 2C, Dk]
    s = state.float()
    out = torch.empty_like(v)
    for c in range(n_chunks):
        read = reads[:, c] @ s
        u = solve_v[:, c] - read[:, :chunk]
        out[:, c] = torch.baddbmm(read[:, chunk:], intra[:, c], u)
        if c < updates:
            s = torch.baddbmm(s * chunk_decay[:, c], k_to_end[:, c].transpose(-1, -2), u)
    out = out.reshape(heads, n_chunks * chunk, -1)[:, :steps].transpose(0, 1)
    return out, (s if final_state else None)


def backward_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """Right-to-left gated delta rule inside each block from a zero state; float32 [T, Hv, Dv].

    Same inputs as :func:`gated_delta_rule` (no state); the tokens start on a block boundary and the
    last block may be partial. All blocks run as one batch: blocks become extra heads, and the
    partial last block is padded so that after reversal the padding comes first with beta = 0 and
    k = 0 (the state stays zero).
    """
    steps = q.shape[0]
    pad = (-steps) % block_size
    n_blocks = (steps + pad) // block_size

    def as_reversed_heads(t: torch.Tensor) -> torch.Tensor:
        # [T, H, ...] -> [block_size, n_blocks * H, ...], time reversed inside each block
        t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) if pad else t
        t = t.reshape(n_blocks, block_size, *t.shape[1:]).flip(1).transpose(0, 1)
        return t.reshape(block_size, -1, *t.shape[3:])

    num_v_heads, head_k, head_v = v.shape[1], k.shape[2], v.shape[2]
    state = torch.zeros(n_blocks * num_v_heads, head_k, head_v, device=q.device, dtype=torch.float32)
    out, _ = gated_delta_rule(
        as_reversed_heads(q),
        as_reversed_heads(k),
        as_reversed_heads(v),
        as_reversed_heads(g),
        as_reversed_heads(beta),
        state,
        scale,
        final_state=False,
    )
    out = out.reshape(block_size, n_blocks, num_v_heads, head_v).transpose(0, 1).flip(1)
    return out.reshape(-1, num_v_heads, head_v)[:steps]


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The GDN layer's core after the short conv, as ``engine/model/gdn.py`` computes it.

    q, k: [T, Hk, Dk] (L2-normalised here when ``normalize_qk``); v: [T, Hv, Dv]; g, beta: [T, Hv];
    state: the committed recurrent state [Hv, Dk, Dv] float32, read-only; z: the output gate
    [T, Hv, Dv]; norm_weight: [Dv]. ``commit`` = how many leading tokens enter the committed state
    (0: none). With ``mix_logits`` [Hv, 2] (bidirectional checkpoints, block mode) the in-block
    backward scan over blocks of ``block_size`` is mixed with the forward scan per head.

    Returns ``(out [T, Hv, Dv] in z's dtype, state after `commit` tokens or None when commit=0)``.
    """
    if normalize_qk:
        q, k = l2_normalize(q), l2_normalize(k)
    steps = q.shape[0]
    if 0 < commit < steps:
        head, committed = gated_delta_rule(
            q[:commit], k[:commit], v[:commit], g[:commit], beta[:commit], state, scale
        )
        assert committed is not None  # final_state: the state after the committed tokens
        tail, _ = gated_delta_rule(
            q[commit:], k[commit:], v[commit:], g[commit:], beta[commit:], committed, scale, final_state=False
        )
        out = torch.cat([head, tail])
    else:
        out, committed = gated_delta_rule(q, k, v, g, beta, state, scale, final_state=commit > 0)
    backward = None
    if mix_logits is not None:
        if block_size is None:
            raise ValueError("the bidirectional branch needs block_size")
        backward = backward_scan(q, k, v, g, beta, block_size, scale)
    normed = gdn_output(out, z, norm_weight, eps, backward, mix_logits)
    return normed, (committed if commit else None)
