"""The engine's own PyTorch operators, where no ``clover_agent.kernels`` reference has the engine's
signature and host-read-free behaviour: attention over the K/V cache, and the MoE block with a
fixed grid for step-sized inputs. They are the ``"torch"`` backend of ``ops.py`` (the CPU path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clover_agent.kernels.moe import reference as moe_reference
from clover_agent.kernels.moe.quant import QuantizedWeight, as_dense

#: Routed-expert calls over at most this many tokens (every block step) run on a fixed grid with no
#: host read; longer ones group the pairs by expert, reading the per-expert counts once per layer.
FIXED_GRID_TOKENS = 64
#: Up to this many tokens (several requests' block passes packed together) the grouped pairs are
#: padded to the busiest expert's count and every expert runs as one batched matmul pair; longer
#: inputs (prefill chunks) and quantised weights take one matmul pair per active expert
#: (``kernels.moe.reference.moe_experts``).
PADDED_GRID_TOKENS = 1024


def attention(
    q: torch.Tensor,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    past: int | torch.Tensor,
    block_size: int,
    block_from: int | None,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gated softmax attention of T new queries over a K/V cache, grouped K/V heads, mask from positions.

    - ``q``: [T, H, D] at positions past .. past+T-1.
    - ``key_buffer``, ``value_buffer``: [capacity, Hkv, D] holding the committed rows [0, past) and
      this forward's rows [past, past+T).
    - ``block_from``: 0 is the block-causal rule, None the causal one (below).
    - ``gate``: [T, H, D]; when given, the result is multiplied by ``sigmoid(gate)``.

    Query row i attends key position j when j <= past + i (causal), or, for rows i >= ``block_from``,
    when j is in the same ``block_size`` block (full attention inside the block). Returns [T, H, D].

    Each block of block rows is one unmasked call over the keys up to the end of its block (no
    mask: every block step); several causal rows (a speculative verify, a causal prefill) are one
    call with a [rows, past + rows] mask compared from positions.

    ``past`` may be a 0-d device tensor instead (a CUDA-graph step, whose context length lives in
    device memory): then the queries attend over the whole buffer under a mask computed on the
    device (:func:`_attention_over_buffer`), with no host read and no shape that depends on it.
    """
    if isinstance(past, torch.Tensor):
        out = _attention_over_buffer(q, key_buffer, value_buffer, past, block_size, block_from, scale)
        return out if gate is None else out * torch.sigmoid(gate)
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
    out = out[0].transpose(0, 1)
    return out if gate is None else out * torch.sigmoid(gate)


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


def routed_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor | QuantizedWeight,
    down_proj: torch.Tensor | QuantizedWeight,
) -> torch.Tensor:
    """Routed SwiGLU experts: ``sum_j w_j * down_e(silu(gate_e x) * up_e x)`` over each token's experts.

    x: [N, Hd]; expert_ids, expert_weights: [N, top_k] (distinct experts per token); gate_up_proj:
    [E, 2I, Hd] (gate rows first); down_proj: [E, Hd, I]. Returns [N, Hd] in x's dtype. Quantised
    weights are dequantised to x's dtype after the slot selection (only the slots' experts).

    Up to :data:`FIXED_GRID_TOKENS` tokens: a fixed grid with no host read (capturable), summed in
    float32. An expert serves each token at most once, so S = min(E, N * top_k) expert slots of N
    rows each hold every pair: the used experts are sorted to the front on the device, and each
    slot runs all N tokens, weighted by the routing weight (0 for tokens routed elsewhere). Longer
    inputs take the kernels' reference, which groups the pairs by expert.
    """
    tokens, top_k = expert_ids.shape
    experts = gate_up_proj.shape[0]
    if tokens > FIXED_GRID_TOKENS:
        if tokens > PADDED_GRID_TOKENS or isinstance(gate_up_proj, QuantizedWeight):
            return moe_reference.moe_experts(x, expert_ids, expert_weights, gate_up_proj, down_proj)
        return _padded_experts(x, expert_ids, expert_weights, gate_up_proj, as_dense(down_proj, x.dtype))
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
    gate_up_proj, down_proj = as_dense(gate_up_proj, x.dtype), as_dense(down_proj, x.dtype)
    gate, up = torch.matmul(x, gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)  # [S, N, I] each
    out = torch.matmul(F.silu(gate) * up, down_proj.transpose(1, 2)).float()  # [S, N, Hd]
    weights = routing.t().unsqueeze(-1)  # [S, N, 1]
    # where(), not a product: an unrouted pair's values may be anything, even inf.
    return torch.where(weights > 0, out * weights, 0.0).sum(0).to(x.dtype)


def _padded_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """:func:`routed_experts` with the pairs sorted by expert into rows of ``capacity`` (the busiest
    expert's count, read back once) per expert: one batched matmul pair over [E, capacity] rows.
    Padding rows are zeros and never read back."""
    tokens, top_k = expert_ids.shape
    experts = gate_up_proj.shape[0]
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    capacity = int(counts.max())
    sorted_ids = flat[order]
    first = torch.cumsum(counts, 0) - counts  # each expert's first pair in sorted order
    slot = sorted_ids * capacity + torch.arange(tokens * top_k, device=x.device) - first[sorted_ids]
    token_of = order // top_k
    rows = x.new_zeros(experts * capacity, x.shape[1])
    rows[slot] = x[token_of]
    gate, up = torch.bmm(rows.view(experts, capacity, -1), gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    hidden = torch.bmm(F.silu(gate) * up, down_proj.transpose(1, 2)).view(experts * capacity, -1)
    out = torch.zeros(tokens, x.shape[1], device=x.device, dtype=torch.float32)
    out.index_add_(0, token_of, hidden[slot].float() * expert_weights.reshape(-1)[order, None].float())
    return out.to(x.dtype)


def sparse_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    top_k: int,
    gate_up_proj: torch.Tensor | QuantizedWeight,
    down_proj: torch.Tensor | QuantizedWeight,
    *,
    shared: torch.Tensor | None = None,
    shared_gate_logits: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE block after its dense projections (contract of ``kernels.moe.reference.sparse_moe``):
    float32 routing, :func:`routed_experts`, then ``residual + routed + sigmoid(gate) * shared``."""
    ids, weights = moe_reference.route(router_logits, top_k)
    routed = routed_experts(x, ids, weights, gate_up_proj, down_proj)
    return moe_reference.moe_combine(routed, shared, shared_gate_logits, residual)
