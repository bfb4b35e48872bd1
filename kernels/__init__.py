"""Triton kernels, each beside a plain-PyTorch reference (imports as ``clover_agent.kernels``)."""
