"""RMS norms: the zero-centred RMSNorm, the GDN gated RMSNorm, and the GDN output epilogue (the
bidirectional branch mix fused into the gated norm). ``reference`` holds the PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.norms.norms import gated_rms_norm, gdn_output, rms_norm

__all__ = ["available", "gated_rms_norm", "gdn_output", "rms_norm"]
