"""The model's heavy operators behind a small name registry.

Every operator the model spends its time in (RMS norms, the GDN short convolution, the gated
delta rule, attention, the routed experts) is one plain function here. The model never calls
them directly: it asks :func:`resolve_ops` for an :class:`Ops` table by backend name, so Triton
kernels (``clover_agent.kernels``) plug in by registering functions of the same signature under
``"triton"``. The ``"torch"`` functions below are the references those kernels are tested against.

Shapes use T for tokens, H for heads, D for head size, C for channels, E for experts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clover_agent.engine.errors import EngineArgumentError

KERNEL_CHOICES: tuple[str, ...] = ("auto", "torch", "triton")
OP_NAMES = ("rms_norm", "gated_rms_norm", "causal_conv1d", "gated_delta_rule", "attention", "moe_experts")

_REGISTRY: dict[str, dict[str, Callable]] = {}

#: Sequence chunk of the chunked gated delta rule. Results do not depend on it beyond rounding; 32
#: (the diffusion block size) makes block-by-block decoding round like a full recompute.
DELTA_RULE_CHUNK = 32


def register(backend: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` the ``name`` operator of ``backend``."""
    if name not in OP_NAMES:
        raise ValueError(f"unknown operator {name!r} (known: {', '.join(OP_NAMES)})")

    def add(fn: Callable) -> Callable:
        _REGISTRY.setdefault(backend, {})[name] = fn
        return fn

    return add


@dataclass(frozen=True)
class Ops:
    """One implementation of every operator; ``backend`` says which."""

    backend: str
    rms_norm: Callable[..., torch.Tensor]
    gated_rms_norm: Callable[..., torch.Tensor]
    causal_conv1d: Callable[..., torch.Tensor]
    gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    attention: Callable[..., torch.Tensor]
    moe_experts: Callable[..., torch.Tensor]


def resolve_ops(kernels: str = "auto") -> Ops:
    """The operator table for ``kernels``: ``"torch"``, ``"triton"``, or ``"auto"`` (the best available).

    ``"auto"`` is the PyTorch reference until Triton kernels are registered.
    """
    if kernels not in KERNEL_CHOICES:
        raise EngineArgumentError(
            f"unknown kernels choice {kernels!r} (choose from {', '.join(KERNEL_CHOICES)})"
        )
    backend = "torch" if kernels == "auto" else kernels
    table = _REGISTRY.get(backend, {})
    missing = [name for name in OP_NAMES if name not in table]
    if missing:
        raise EngineArgumentError(
            f"kernels={kernels!r}: no {backend} implementation of {', '.join(missing)} is available in this "
            "build; use kernels='torch' (or 'auto')"
        )
    return Ops(backend=backend, **table)


# ---- PyTorch reference implementations ---------------------------------------------------


@register("torch", "rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: ``x / rms(x) * (1 + weight)``, computed in float32, returned in x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


@register("torch", "gated_rms_norm")
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``weight * x / rms(x) * silu(gate)`` (plain weight, norm before gate)."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)


@register("torch", "causal_conv1d")
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution continuing from ``state`` (no activation).

    x: [T, C]; weight: [C, K] (tap K-1 multiplies the current row); state: [C, K-1], the K-1
    rows before x (zeros at the start of a sequence). Returns [T, C] in x's dtype.
    """
    rows = torch.cat([state.to(weight.dtype), x.to(weight.dtype).t()], dim=1)  # [C, K-1+T]
    out = F.conv1d(rows.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0]
    return out.t().to(x.dtype)


@register("torch", "gated_delta_rule")
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over T steps from ``state``; returns (outputs, final state), both float32.

    q, k: [T, Hk, Dk] (already L2-normalised); v: [T, Hv, Dv]; g: [T, Hv] log-decay (<= 0);
    beta: [T, Hv]; state: [Hv, Dk, Dv]. Value head h reads key head ``h // (Hv // Hk)``.
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
    # (I + A) U = beta V - beta Γ K S0, with A[t, s] = beta_t Γ_t/Γ_s k_t·k_s for s < t
    system = (k_beta @ k.transpose(-1, -2)) * decay_ts
    system = system.masked_fill(~causal.tril(-1), 0.0) + torch.eye(chunk, device=q.device)
    solve_v = torch.linalg.solve_triangular(system, v * beta.unsqueeze(-1), upper=False, unitriangular=True)
    solve_k = torch.linalg.solve_triangular(
        system, k_beta * log_decay.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    intra = (q @ k.transpose(-1, -2)) * decay_ts
    q_decayed = q * log_decay.exp().unsqueeze(-1)
    chunk_total = chunk_total64.float()
    k_to_end = k * (chunk_total64 - log_decay64).exp().float().unsqueeze(-1)

    s = state.float()
    out = torch.empty_like(v)
    for c in range(n_chunks):
        u = solve_v[:, c] - solve_k[:, c] @ s
        out[:, c] = q_decayed[:, c] @ s + intra[:, c] @ u
        s = s * chunk_total[:, c].exp().unsqueeze(-1) + k_to_end[:, c].transpose(-1, -2) @ u
    out = out.reshape(heads, n_chunks * chunk, -1)[:, :steps].transpose(0, 1)
    return out, s


@register("torch", "attention")
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention with grouped K/V heads under an explicit mask.

    q: [T, H, D]; k, v: [S, Hkv, D]; allowed: [T, S] bool (True = may attend). Returns [T, H, D].
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


@register("torch", "moe_experts")
def moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SwiGLU experts: ``sum_j w_j * down_e(silu(gate_e x) * up_e x)`` over each token's experts.

    x: [N, Hd]; expert_ids, expert_weights: [N, top_k]; gate_up_proj: [E, 2I, Hd] (gate rows
    first); down_proj: [E, Hd, I]. Returns [N, Hd] in x's dtype.
    """
    out = torch.zeros_like(x)
    flat_ids = expert_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=gate_up_proj.shape[0]).tolist()
    token_of = order // expert_ids.shape[1]
    weight_of = expert_weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        tokens = token_of[start : start + count]
        gate, up = F.linear(x[tokens], gate_up_proj[expert]).chunk(2, dim=-1)
        hidden = F.linear(F.silu(gate) * up, down_proj[expert])
        out.index_add_(0, tokens, (hidden * weight_of[start : start + count, None]).to(x.dtype))
        start += count
    return out
