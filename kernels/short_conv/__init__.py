"""The GDN short convolution: causal depthwise conv continuing from the conv state (read, never
written), plus Clover's block-local right conv and the SiLU, in one kernel. ``reference`` holds the
PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.short_conv.conv import causal_conv1d, short_conv

__all__ = ["available", "causal_conv1d", "short_conv"]
