"""Launchers of the fused MoE kernels: tile choice, output allocation, fixed worst-case grids.

Nothing here reads a device value back to the host, so every function is safe inside a CUDA
graph for a fixed number of tokens.
"""

from __future__ import annotations

import torch
import triton

from clover_agent.kernels.moe import triton_kernels as tk
from clover_agent.kernels.moe.quant import QuantizedWeight
from clover_agent.kernels.moe.reference import max_padded_pairs
from clover_agent.kernels.moe.tiles import Tiles, tiles_for
from clover_agent.kernels.runtime import dot_precision

#: Pairs handled per program of the alignment kernel's scans.
_ALIGN_BLOCK = 1024


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Device top-k routing; same contract as :func:`reference.route` (float32 softmax, top-k in
    descending order, renormalised; ids int64 [N, k], weights [N, k] in the logits' dtype)."""
    tokens, experts = router_logits.shape
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=logits.dtype, device=logits.device)
    if tokens:
        tk.route_kernel[(tokens,)](
            logits,
            ids,
            weights,
            experts,
            logits.stride(0),
            TOP_K=top_k,
            BLOCK_K=triton.next_power_of_2(top_k),
            BLOCK_E=triton.next_power_of_2(experts),
        )
    return ids, weights


def align_pairs(
    expert_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device alignment of pairs to expert tiles; same outputs as :func:`reference.align_pairs`
    (entries past ``num_padded`` are left unwritten)."""
    flat = expert_ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    pairs = flat.numel()
    capacity = max_padded_pairs(pairs, num_experts, block_m)
    device = flat.device
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=device)
    block_experts = torch.empty(capacity // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    tk.align_kernel[(num_experts,)](
        flat,
        sorted_pairs,
        block_experts,
        num_padded,
        pairs,
        num_experts,
        BLOCK_M=block_m,
        BLOCK_P=min(_ALIGN_BLOCK, triton.next_power_of_2(max(pairs, 16))),
        BLOCK_E=triton.next_power_of_2(num_experts),
    )
    return sorted_pairs, block_experts, num_padded


def _weight_args(w: torch.Tensor | QuantizedWeight) -> tuple[list, dict, int | None]:
    """(tensor arguments: weights, scales and both's strides; constexprs; the scale block along K,
    which BLOCK_K may not exceed: None for dense weights) of one weight."""
    if not isinstance(w, QuantizedWeight):
        return [w, w, *w.stride(), 0, 0, 0], {"QUANT": "none", "SCALE_N": 1, "SCALE_K": 1}, None
    scale_n, scale_k = w.block
    if scale_k < 16 or scale_k & (scale_k - 1):
        raise ValueError(f"the kernels need a power-of-two scale block of at least 16 inputs, not {scale_k}")
    constexprs = {"QUANT": w.scheme, "SCALE_N": scale_n, "SCALE_K": scale_k}
    return [w.data, w.scale, *w.data.stride(), *w.scale.stride()], constexprs, scale_k


def routed_pairs(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor | QuantizedWeight,
    down_proj: torch.Tensor | QuantizedWeight,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """Weighted expert output of every pair, [N * k, Hd] in x's dtype (row ``n * k + j``).
    Quantised weights are dequantised tile by tile in the kernels' K loops. ``tiles``: the GEMMs'
    launch shape (default: :func:`tiles.tiles_for`, a tuned table's or the heuristic's)."""
    tokens, hidden = x.shape
    top_k = expert_ids.shape[1]
    experts, two_inner, _ = gate_up_proj.shape
    inner = two_inner // 2
    pairs = tokens * top_k
    gate_up_args, gate_up_quant, gate_up_max_k = _weight_args(gate_up_proj)
    down_args, down_quant, down_max_k = _weight_args(down_proj)
    if tiles is None:
        tiles = tiles_for(
            tokens,
            experts=experts,
            hidden=hidden,
            inner=inner,
            top_k=top_k,
            dtype=x.dtype,
            quant=gate_up_quant["QUANT"],
            device=x.device,
            scale_k=min((k for k in (gate_up_max_k, down_max_k) if k is not None), default=None),
        )
    block_m, block_n = tiles.block_m, tiles.block_n
    launch = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    sorted_pairs, block_experts, num_padded = align_pairs(expert_ids, experts, block_m)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weights = expert_weights.reshape(-1).contiguous()
    precision = dot_precision(x.dtype)
    programs = block_experts.numel()  # tiles of pairs, a fixed worst case

    hidden_states = torch.empty(pairs, inner, dtype=x.dtype, device=x.device)
    (w, scale, *w_strides), quant = gate_up_args, gate_up_quant
    block_k = min(tiles.block_k, gate_up_max_k or tiles.block_k)
    tk.gate_up_kernel[(programs, triton.cdiv(inner, block_n))](
        x,
        w,
        scale,
        hidden_states,
        sorted_pairs,
        block_experts,
        num_padded,
        pairs,
        hidden,
        inner,
        x.stride(0),
        *w_strides,
        hidden_states.stride(0),
        TOP_K=top_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION=precision,
        **quant,
        **launch,
    )
    out = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    (w, scale, *w_strides), quant = down_args, down_quant
    block_k = min(tiles.block_k, down_max_k or tiles.block_k)
    tk.down_kernel[(programs, triton.cdiv(hidden, block_n))](
        hidden_states,
        w,
        scale,
        weights,
        out,
        sorted_pairs,
        block_experts,
        num_padded,
        pairs,
        hidden,
        inner,
        hidden_states.stride(0),
        *w_strides,
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION=precision,
        **quant,
        **launch,
    )
    return out


def moe_combine(
    pair_out: torch.Tensor,
    top_k: int,
    shared: torch.Tensor | None = None,
    shared_gate_logits: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + sum_j pair_out[n*k + j] + sigmoid(shared_gate_logits) * shared`` per token, summed
    in a fixed order in float32 (deterministic: no atomics). pair_out: [N * k, Hd]."""
    pairs, hidden = pair_out.shape
    tokens = pairs // top_k
    out = torch.empty(tokens, hidden, dtype=pair_out.dtype, device=pair_out.device)
    if tokens == 0:
        return out
    block_h = min(1024, triton.next_power_of_2(hidden))
    dummy = out
    tk.combine_kernel[(tokens, triton.cdiv(hidden, block_h))](
        pair_out,
        shared if shared is not None else dummy,
        shared_gate_logits if shared_gate_logits is not None else dummy,
        residual if residual is not None else dummy,
        out,
        hidden,
        pair_out.stride(0),
        shared.stride(0) if shared is not None else 0,
        shared_gate_logits.stride(0) if shared_gate_logits is not None else 0,
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        TOP_K=top_k,
        HAS_SHARED=shared is not None,
        HAS_SHARED_GATE=shared_gate_logits is not None,
        HAS_RESIDUAL=residual is not None,
        BLOCK_H=block_h,
    )
    return out


def moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_weights: torch.Tensor,
    gate_up_proj: torch.Tensor | QuantizedWeight,
    down_proj: torch.Tensor | QuantizedWeight,
) -> torch.Tensor:
    """Routed SwiGLU experts; the contract of :func:`reference.moe_experts` (``ops.moe_experts``):
    x [N, Hd], expert_ids / expert_weights [N, k], gate_up_proj [E, 2I, Hd] (gate rows first),
    down_proj [E, Hd, I], all read-only; returns a new [N, Hd] tensor in x's dtype."""
    _check_rows(x, gate_up_proj, down_proj)
    if x.shape[0] == 0:
        return torch.zeros_like(x)
    pair_out = routed_pairs(x, expert_ids, expert_weights, gate_up_proj, down_proj)
    return moe_combine(pair_out, expert_ids.shape[1])


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
    """The MoE block after its dense projections (contract of :func:`reference.sparse_moe`): device
    routing, the two grouped GEMMs and one combine with the gated shared expert and the residual.
    Five launches, no host read-back."""
    _check_rows(x, gate_up_proj, down_proj)
    if x.shape[0] == 0:
        return torch.zeros_like(x) if residual is None else residual.clone()
    ids, weights = route(router_logits, top_k)
    pair_out = routed_pairs(x, ids, weights, gate_up_proj, down_proj)
    return moe_combine(pair_out, top_k, shared, shared_gate_logits, residual)


def _check_rows(
    x: torch.Tensor, gate_up_proj: torch.Tensor | QuantizedWeight, down_proj: torch.Tensor | QuantizedWeight
) -> None:
    stored = [w.data if isinstance(w, QuantizedWeight) else w for w in (gate_up_proj, down_proj)]
    if any(w.stride(-1) != 1 for w in stored):
        raise ValueError("the expert weights must be contiguous in their last dimension")
    if x.dim() != 2 or x.shape[1] != gate_up_proj.shape[2] or down_proj.shape[1] != x.shape[1]:
        raise ValueError(
            f"moe shapes disagree: x {tuple(x.shape)}, gate_up_proj {tuple(gate_up_proj.shape)}, "
            f"down_proj {tuple(down_proj.shape)}"
        )
