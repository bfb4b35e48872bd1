"""Shared pieces of the kernel tests: the device and the skip marker."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels.runtime import triton_problem

#: The device the kernel tests run on: the GPU when there is one, else the interpreter's CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

requires_triton = pytest.mark.skipif(
    triton_problem() is not None, reason=f"triton kernels cannot run: {triton_problem()}"
)
