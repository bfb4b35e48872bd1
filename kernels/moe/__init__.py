"""Fused sparse MoE: device routing, tile-aligned token-expert pairs, grouped SwiGLU GEMMs, and a
deterministic combine with the gated shared expert and the residual.

``reference`` holds the plain-PyTorch functions (the CPU path); the same names here are the Triton
versions, usable when :func:`available` is true.
"""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.moe.fused_moe import align_pairs, moe_combine, moe_experts, route, sparse_moe

__all__ = ["align_pairs", "available", "moe_combine", "moe_experts", "route", "sparse_moe"]
