"""Sparse mixture of experts with a gated shared expert (the MLP of every layer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_agent.engine.config import CloverConfig
from clover_agent.engine.ops import Ops


class RoutedExperts(nn.Module):
    """All routed experts' weights, fused: ``gate_up_proj`` [E, 2I, H] (gate rows first), ``down_proj`` [E, H, I]."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.zeros(experts, hidden, inner))


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts and weights [N, top_k] of each token: softmax in float32 whatever the model's dtype
    (in bf16 near-equal probabilities round together and the top-k picks other experts), top-k,
    renormalised, weights returned in the logits' dtype."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    top_probs, top_ids = torch.topk(probs, top_k, dim=-1)
    return top_ids, (top_probs / top_probs.sum(dim=-1, keepdim=True)).to(router_logits.dtype)


class SparseMoe(nn.Module):
    """Router (float32 softmax, top-k, renormalised) over routed experts, plus the shared expert
    scaled by a sigmoid gate."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = RoutedExperts(config)
        self.shared_expert = SharedExpert(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        top_ids, top_weights = route(self.gate(x), self.top_k)
        routed = ops.moe_experts(x, top_ids, top_weights, self.experts.gate_up_proj, self.experts.down_proj)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared
