"""Gated DeltaNet core: the gated delta rule step by step (decoding blocks, with Clover's in-block
backward branch in the same launch) or chunked (prefill), the whole layer core with the branch mix
and gated RMSNorm epilogue, and the per-head gates (decay and write strength) in one launch. ``reference`` holds the PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.gated_delta_rule.gdn import (
        chunk_precision,
        gated_delta_net,
        gated_delta_rule,
        gdn_gates,
    )

__all__ = ["available", "chunk_precision", "gated_delta_net", "gated_delta_rule", "gdn_gates"]
