"""The model's heavy operators and the per-op kernel contract.

Every operator the model spends its time in (RMS norms, the GDN short convolution, the gated delta
rule, attention, the routed experts) is one function of a fixed signature, implemented by one or
more backends: ``"torch"`` (the plain-PyTorch references below, which run everywhere and are what
the Triton kernels are tested against) and ``"triton"`` (``clover_agent.kernels``, registered
through :data:`TRITON_PROVIDERS`). The model asks :func:`resolve_ops` for an :class:`Ops` table and
each operator is resolved on its own:

* ``kernels="torch"``: every operator from PyTorch;
* ``kernels="auto"``: per operator, Triton on a CUDA device when it is importable and implements
  that operator, PyTorch otherwise (so one missing or broken kernel falls back alone);
* ``kernels="triton"``: Triton for every operator, also on the CPU under ``TRITON_INTERPRET=1``;
  an operator without a usable Triton implementation is an error naming it;
* a mapping ``{"attention": "triton", ...}``: those operators from that backend, the rest ``auto``.

Shapes use T for tokens, H for heads, D for head size, C for channels, E for experts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from clover_agent.engine.errors import EngineArgumentError

KERNEL_CHOICES: tuple[str, ...] = ("auto", "torch", "triton")
OP_NAMES = ("rms_norm", "gated_rms_norm", "causal_conv1d", "gated_delta_rule", "attention", "moe_experts")
KernelChoice = str | Mapping[str, str]

#: op name -> backend -> implementation.
_REGISTRY: dict[str, dict[str, Callable]] = {}
#: Triton implementations, imported when first resolved: op name -> (module, function name).
#: Kernels register here as they land in ``clover_agent.kernels``.
TRITON_PROVIDERS: dict[str, tuple[str, str]] = {}

#: Sequence chunk of the chunked gated delta rule. Results do not depend on it beyond rounding; 32
#: (the diffusion block size) makes block-by-block decoding round like a full recompute.
DELTA_RULE_CHUNK = 32
#: Routed-expert calls over at most this many tokens (every block step) run on a fixed grid with no
#: host read; longer ones (prefill chunks) read the per-expert counts once per layer.
FIXED_GRID_TOKENS = 64


def register(op: str, backend: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` the ``op`` operator of ``backend``."""
    if op not in OP_NAMES:
        raise ValueError(f"unknown operator {op!r} (known: {', '.join(OP_NAMES)})")

    def add(fn: Callable) -> Callable:
        _REGISTRY.setdefault(op, {})[backend] = fn
        return fn

    return add


@dataclass(frozen=True)
class Ops:
    """One implementation of every operator; ``backends`` says which backend each came from."""

    rms_norm: Callable[..., torch.Tensor]
    gated_rms_norm: Callable[..., torch.Tensor]
    causal_conv1d: Callable[..., torch.Tensor]
    gated_delta_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    attention: Callable[..., torch.Tensor]
    moe_experts: Callable[..., torch.Tensor]
    backends: dict[str, str] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        """The one backend every operator came from, or ``"mixed"``."""
        names = set(self.backends.values())
        return names.pop() if len(names) == 1 else "mixed"


def triton_unusable(device: torch.device) -> str | None:
    """Why Triton kernels cannot run on ``device`` (None when they can)."""
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton runs on the CPU only under TRITON_INTERPRET=1"
    if device.type not in ("cpu", "cuda"):
        return f"Triton does not run on {device.type} devices"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    return None


def _implementation(op: str, backend: str, device: torch.device) -> tuple[Callable | None, str]:
    """(implementation, why not) of ``op`` in ``backend`` on ``device``."""
    if backend == "triton":
        if op not in TRITON_PROVIDERS:
            return None, "no Triton kernel in this build"
        reason = triton_unusable(device)
        if reason:
            return None, reason
        module, name = TRITON_PROVIDERS[op]
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            return None, f"{module}.{name} cannot be imported ({exc})"
        return fn, ""
    fn = _REGISTRY.get(op, {}).get(backend)
    return (fn, "") if fn is not None else (None, f"no {backend} implementation")


def _choices(kernels: KernelChoice) -> dict[str, str]:
    if isinstance(kernels, str):
        if kernels not in KERNEL_CHOICES:
            raise EngineArgumentError(
                f"unknown kernels choice {kernels!r} (choose from {', '.join(KERNEL_CHOICES)})"
            )
        return dict.fromkeys(OP_NAMES, kernels)
    unknown = sorted(set(kernels) - set(OP_NAMES))
    if unknown:
        raise EngineArgumentError(
            f"kernels: unknown operator(s) {', '.join(unknown)} (known: {', '.join(OP_NAMES)})"
        )
    return {op: kernels.get(op, "auto") for op in OP_NAMES}


def check_kernels(kernels: KernelChoice) -> None:
    """Raise an EngineArgumentError now for a choice :func:`resolve_ops` could never accept."""
    _choices(kernels)


def resolve_ops(kernels: KernelChoice = "auto", device: torch.device | str = "cpu") -> Ops:
    """The operator table for ``kernels`` on ``device``, resolved operator by operator (module doc)."""
    device = torch.device(device)
    chosen: dict[str, Callable] = {}
    backends: dict[str, str] = {}
    missing: list[str] = []
    for op, choice in _choices(kernels).items():
        if choice == "auto":
            fn, _ = _implementation(op, "triton", device) if device.type == "cuda" else (None, "")
            backend = "triton" if fn is not None else "torch"
            fn = fn or _REGISTRY[op]["torch"]
        else:
            fn, why = _implementation(op, choice, device)
            backend = choice
            if fn is None:
                missing.append(f"{op} ({why})")
                continue
        chosen[op], backends[op] = fn, backend
    if missing:
        raise EngineArgumentError(
            f"kernels={kernels!r} on {device.type}: no usable implementation of {'; '.join(missing)}. "
            "Use kernels='auto' (the fastest available per operator) or 'torch'"
        )
    return Ops(**chosen, backends=backends)


# ---- PyTorch reference implementations ---------------------------------------------------


@register("rms_norm", "torch")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: ``x / rms(x) * (1 + weight)``, computed in float32, returned in x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


@register("gated_rms_norm", "torch")
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``weight * x / rms(x) * silu(gate)`` (plain weight, norm before gate)."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)


@register("causal_conv1d", "torch")
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution continuing from ``state`` (no activation).

    x: [T, C]; weight: [C, K] (tap K-1 multiplies the current row); state: [C, K-1], the K-1
    rows before x (zeros at the start of a sequence). Returns [T, C] in x's dtype.
    """
    rows = torch.cat([state.to(weight.dtype), x.to(weight.dtype).t()], dim=1)  # [C, K-1+T]
    out = F.conv1d(rows.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0]
    return out.t().to(x.dtype)


@register("gated_delta_rule", "torch")
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


@register("attention", "torch")
def attention(
    q: torch.Tensor,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    past: int | torch.Tensor,
    block_size: int,
    block_from: int | None,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of T new queries over a K/V cache, grouped K/V heads, mask from positions.

    q: [T, H, D] at positions past .. past+T-1; key_buffer, value_buffer: [capacity, Hkv, D] holding
    the committed rows [0, past) and this forward's rows [past, past+T). Query row i attends key
    position j when j <= past + i (causal), or, for rows i >= ``block_from``, when j is in the same
    ``block_size`` block (full attention inside the block): ``block_from=0`` is the block-causal
    rule, None the causal one. Returns [T, H, D].

    Each block of block rows is one unmasked call over the keys up to the end of its block (no
    mask: every block step); several causal rows (a speculative verify, a causal prefill) are one
    call with a [rows, past + rows] mask compared from positions.

    ``past`` may be a 0-d device tensor instead (a CUDA-graph step, whose context length lives in
    device memory): then the queries attend over the whole buffer under a mask computed on the
    device (:func:`_attention_over_buffer`), with no host read and no shape that depends on it.
    """
    if isinstance(past, torch.Tensor):
        return _attention_over_buffer(q, key_buffer, value_buffer, past, block_size, block_from, scale)
    steps = q.shape[0]
    causal_rows = steps if block_from is None else block_from
    # [1, H, T, D] and [1, Hkv, capacity, D]: with the batch dimension SDPA takes its fused kernels.
    heads_first = q.transpose(0, 1)[None]
    keys, values = key_buffer.transpose(0, 1)[None], value_buffer.transpose(0, 1)[None]
    pieces: list[torch.Tensor] = []

    def attend(start: int, end: int, key_end: int, mask: torch.Tensor | None) -> None:
        pieces.append(
            F.scaled_dot_product_attention(
                heads_first[:, :, start:end],
                keys[:, :, :key_end],
                values[:, :, :key_end],
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )
        )

    if causal_rows:
        end = past + causal_rows
        mask = None
        if causal_rows > 1:
            keys_at = torch.arange(end, device=q.device)
            mask = keys_at[None, :] <= keys_at[past:, None]
        attend(0, causal_rows, end, mask)
    row = causal_rows
    while row < steps:
        block_end = min(steps, ((past + row) // block_size + 1) * block_size - past)
        attend(row, block_end, past + block_end, None)
        row = block_end
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    return out[0].transpose(0, 1)


def _attention_over_buffer(
    q: torch.Tensor,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    past: torch.Tensor,
    block_size: int,
    block_from: int | None,
    scale: float,
) -> torch.Tensor:
    """:func:`attention` with the context length on the device: every buffer row is a key, masked
    by the rule from positions (rows past the new tokens never match). Grouped heads are a reshape,
    not a copy: the queries of a K/V head's group are its rows."""
    steps, heads, dim = q.shape
    capacity, kv_heads, _ = key_buffer.shape
    group = heads // kv_heads
    query_at = past + torch.arange(steps, device=q.device)  # [T]
    key_at = torch.arange(capacity, device=q.device)  # [S]
    allowed = key_at[None, :] <= query_at[:, None]
    if block_from is not None:
        same_block = (key_at[None, :] // block_size == query_at[:, None] // block_size) & (
            key_at[None, :] < past + steps
        )
        allowed |= same_block & (torch.arange(steps, device=q.device)[:, None] >= block_from)
    grouped = q.reshape(steps, kv_heads, group, dim).permute(1, 2, 0, 3).reshape(kv_heads, group * steps, dim)
    scores = (grouped.float() @ key_buffer.permute(1, 2, 0).float()) * scale  # [Hkv, G*T, S]
    scores = scores.view(kv_heads, group, steps, capacity).masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(kv_heads, group * steps, capacity)
    out = (probs @ value_buffer.transpose(0, 1).float()).view(kv_heads, group, steps, dim)
    return out.permute(2, 0, 1, 3).reshape(steps, heads, dim).to(q.dtype)


@register("moe_experts", "torch")
def moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """Routed SwiGLU experts: ``sum_j w_j * down_e(silu(gate_e x) * up_e x)`` over each token's experts.

    x: [N, Hd]; expert_ids, expert_weights: [N, top_k] (distinct experts per token); gate_up_proj:
    [E, 2I, Hd] (gate rows first); down_proj: [E, Hd, I]. Returns [N, Hd] in x's dtype, summed in
    float32.

    Up to :data:`FIXED_GRID_TOKENS` tokens: a fixed grid with no host read (capturable). An expert
    serves each token at most once, so S = min(E, N * top_k) expert slots of N rows each hold every
    pair: the used experts are sorted to the front on the device, and each slot runs all N tokens,
    weighted by the routing weight (0 for tokens routed elsewhere). Longer inputs group the pairs
    by expert, which reads the per-expert counts on the host once.
    """
    tokens, top_k = expert_ids.shape
    experts = gate_up_proj.shape[0]
    if tokens > FIXED_GRID_TOKENS:
        return _moe_grouped(x, expert_ids, expert_weights, gate_up_proj, down_proj)
    routing = torch.zeros(tokens, experts, device=x.device, dtype=torch.float32)
    routing.scatter_(1, expert_ids, expert_weights.float())  # [N, E]
    slots = min(experts, tokens * top_k)
    if slots < experts:
        used = torch.zeros(experts, device=x.device, dtype=torch.int8).index_fill_(
            0, expert_ids.reshape(-1), 1
        )
        slot_experts = torch.argsort(1 - used, stable=True)[:slots]  # used experts first
        gate_up_proj = gate_up_proj.index_select(0, slot_experts)
        down_proj = down_proj.index_select(0, slot_experts)
        routing = routing.index_select(1, slot_experts)
    gate, up = torch.matmul(x, gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [S, N, I] each
    out = torch.matmul(F.silu(gate) * up, down_proj.transpose(1, 2)).float()  # [S, N, Hd]
    weights = routing.t().unsqueeze(-1)  # [S, N, 1]
    # where(), not a product: an unrouted pair's values may be anything, even inf.
    return torch.where(weights > 0, out * weights, 0.0).sum(0).to(x.dtype)


def _moe_grouped(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """The long-input path of :func:`moe_experts`: the pairs sorted by expert, one matmul per used expert."""
    out = torch.zeros(x.shape, device=x.device, dtype=torch.float32)
    flat_ids = expert_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=gate_up_proj.shape[0]).tolist()  # the one host read
    token_of = order // expert_ids.shape[1]
    weight_of = expert_weights.reshape(-1)[order].float()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[start : start + count]
        gate, up = F.linear(x[rows], gate_up_proj[expert]).chunk(2, dim=-1)
        hidden = F.linear(F.silu(gate) * up, down_proj[expert]).float()
        out.index_add_(0, rows, hidden * weight_of[start : start + count, None])
        start += count
    return out.to(x.dtype)
