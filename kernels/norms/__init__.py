"""RMS norms: the zero-centred RMSNorm (alone, after the residual add, or before an attention
head's rotary embedding, each in one launch), the GDN gated RMSNorm, and the GDN output epilogue
(the bidirectional branch mix fused into the gated norm). ``reference`` holds the PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.norms.norms import (
        add_rms_norm,
        gated_rms_norm,
        gdn_output,
        rms_norm,
        rms_norm_rotary,
    )

__all__ = ["add_rms_norm", "available", "gated_rms_norm", "gdn_output", "rms_norm", "rms_norm_rotary"]
