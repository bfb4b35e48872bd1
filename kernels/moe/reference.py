"""Plain-PyTorch reference of the sparse MoE: routing, routed SwiGLU experts, the combine with the
gated shared expert and the residual, and the tile alignment of token-expert pairs the Triton
kernels use. These are the engine's CPU path (``engine/model/moe.py`` and ``ops.moe_experts``).

Shapes: N tokens, Hd hidden size, E experts, I expert inner size, k experts per token; a *pair* is
one (token, slot) of the routing, numbered ``n * k + j``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clover_agent.kernels.moe.quant import QuantizedWeight


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: float32 softmax over experts, top-k, renormalised to sum 1.

    router_logits: [N, E] (any float dtype). Returns ``(expert_ids [N, k] int64, weights [N, k])``,
    slots in descending probability, weights in ``router_logits``' dtype. The softmax is float32
    even for bf16 logits (a bf16 softmax picks other experts at full size).
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    top_probs, top_ids = torch.topk(probs, top_k, dim=-1)
    top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
    return top_ids, top_probs.to(router_logits.dtype)


def moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor | QuantizedWeight,
    down_proj: torch.Tensor | QuantizedWeight,
) -> torch.Tensor:
    """Routed SwiGLU experts: ``sum_j w_j * down_e(silu(gate_e x) * up_e x)`` over each token's experts.

    x: [N, Hd]; expert_ids, expert_weights: [N, k]; gate_up_proj: [E, 2I, Hd] (gate rows first);
    down_proj: [E, Hd, I]. Returns [N, Hd] in x's dtype. All inputs are read-only. Quantised
    weights (``quant.QuantizedWeight``) are dequantised to x's dtype one active expert at a time.

    One matmul pair per active expert: the per-expert counts are read back to the host once
    (fine on the CPU; the Triton path needs no read-back).
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
        gate, up = F.linear(x[tokens], _expert(gate_up_proj, expert, x.dtype)).chunk(2, dim=-1)
        hidden = F.linear(F.silu(gate) * up, _expert(down_proj, expert, x.dtype))
        out.index_add_(0, tokens, (hidden * weight_of[start : start + count, None]).to(x.dtype))
        start += count
    return out


def _expert(weights: torch.Tensor | QuantizedWeight, expert: int, dtype: torch.dtype) -> torch.Tensor:
    return weights.expert(expert, dtype) if isinstance(weights, QuantizedWeight) else weights[expert]


def moe_combine(
    routed: torch.Tensor,
    shared: torch.Tensor | None = None,
    shared_gate_logits: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + routed + sigmoid(shared_gate_logits) * shared`` (each term optional but routed).

    routed, shared, residual: [N, Hd]; shared_gate_logits: [N, 1] (the ``shared_expert_gate``
    projection). Returns [N, Hd] in routed's dtype.
    """
    out = routed
    if shared is not None:
        gate = torch.sigmoid(shared_gate_logits) if shared_gate_logits is not None else 1.0
        out = out + gate * shared
    if residual is not None:
        out = residual + out
    return out


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
    """The MoE block after its dense projections: route, routed experts, combine.

    ``router_logits`` = ``x @ gate.weight.T`` [N, E]; ``shared`` = the shared expert's output
    [N, Hd]; ``shared_gate_logits`` = ``x @ shared_expert_gate.weight.T`` [N, 1]; ``residual``
    [N, Hd] is added last (the decoder layer's skip connection). Everything is read-only.
    """
    ids, weights = route(router_logits, top_k)
    routed = moe_experts(x, ids, weights, gate_up_proj, down_proj)
    return moe_combine(routed, shared, shared_gate_logits, residual)


def align_pairs(
    expert_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-expert pairs grouped by expert (stable: pair order inside an expert), each expert's run
    padded to a multiple of ``block_m``; computed on the device without a host read-back.

    expert_ids: [N, k]. Returns ``(sorted_pairs, block_experts, num_padded)``:
    ``sorted_pairs`` int32 [max_padded_pairs(P, E, block_m)]: pair indices, padding slots hold
    ``P = N * k``; ``block_experts`` int32 [max_padded / block_m]: the expert of each tile;
    ``num_padded`` int32 [1]: the used length. Entries past ``num_padded`` are unspecified (the
    reference writes P and -1 there).
    """
    flat = expert_ids.reshape(-1).long()
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).index_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    first_of_expert = torch.cumsum(counts, 0) - counts
    sorted_experts = flat[order]
    rank = torch.arange(pairs, device=device) - first_of_expert[sorted_experts]
    capacity = max_padded_pairs(pairs, num_experts, block_m)
    sorted_pairs = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, starts[sorted_experts] + rank, order.to(torch.int32))
    tile_starts = torch.arange(capacity // block_m, device=device) * block_m
    ends = starts + padded
    block_experts = torch.searchsorted(ends, tile_starts, right=True).to(torch.int32)
    num_padded = padded.sum().reshape(1).to(torch.int32)
    block_experts = torch.where(tile_starts < num_padded, block_experts, -1).to(torch.int32)
    return sorted_pairs, block_experts, num_padded


def max_padded_pairs(pairs: int, num_experts: int, block_m: int) -> int:
    """Worst-case length of the aligned pair list (a multiple of ``block_m``): every pair, plus up to
    ``block_m - 1`` padding slots for each expert that can be active."""
    worst = pairs + min(num_experts, pairs) * (block_m - 1)
    return (worst + block_m - 1) // block_m * block_m
