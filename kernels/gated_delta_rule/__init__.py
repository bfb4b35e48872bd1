"""Gated DeltaNet core: the gated delta rule step by step (decoding blocks, with Clover's in-block
backward branch in the same launch) or chunked (prefill), and the whole layer core with the branch
mix and gated RMSNorm epilogue. ``reference`` holds the PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.gated_delta_rule.gdn import gated_delta_net, gated_delta_rule

__all__ = ["available", "gated_delta_net", "gated_delta_rule"]
