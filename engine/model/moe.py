"""Sparse mixture of experts with a gated shared expert (the MLP of every layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.ops import Ops
from clover_agent.kernels.moe import reference as moe_reference

if TYPE_CHECKING:
    from clover_agent.engine.model.quantized import QuantizedRoutedExperts


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


class SparseMoe(nn.Module):
    """Router (float32 softmax, top-k, renormalised) over routed experts, plus the shared expert
    scaled by a sigmoid gate."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        # The loader may replace them by their quantised form (``engine/model/quantized.py``).
        self.experts: RoutedExperts | QuantizedRoutedExperts = RoutedExperts(config)
        self.shared_expert = SharedExpert(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        #: Where the routed experts are: ``"device"`` (the model's, with everything else) or
        #: ``"host"`` (host memory, computed by the CPU: :meth:`host_forward`); the loader sets it.
        self.experts_on = "device"

    def forward(self, x: torch.Tensor, ops: Ops, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + routed experts + sigmoid(gate) * shared expert`` (``ops.sparse_moe``)."""
        if self.experts_on == "host":
            return self.host_forward(x, residual)
        return ops.sparse_moe(
            x,
            self.gate(x),
            self.top_k,
            self.experts.gate_up_proj,
            self.experts.down_proj,
            shared=self.shared_expert(x),
            shared_gate_logits=self.shared_expert_gate(x),
            residual=residual,
        )

    def host_forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MoE with its routed experts in host memory: routing, the shared expert and the combine
        on the model's device; the tokens' rows, expert ids and weights copied to the host, the
        routed experts computed there by the CPU (``kernels.moe.reference.moe_experts``, grouped by
        expert, quantised weights dequantised one expert at a time), the result copied back. Each
        copy waits for the device, so a CUDA graph cannot capture it (the decoder runs eager)."""
        ids, weights = moe_reference.route(self.gate(x), self.top_k)
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        host = gate_up.device
        routed = moe_reference.moe_experts(x.to(host), ids.to(host), weights.to(host), gate_up, down)
        return moe_reference.moe_combine(
            routed.to(x.device), self.shared_expert(x), self.shared_expert_gate(x), residual
        )
