"""Token choice and the LowConfidence fill over full-vocabulary rows without a [T, V] probability
tensor: controls (penalties, per-row biases, forced rows) applied as tiles stream in, greedy or
sampled choice (temperature, top-k, top-p, a seeded Gumbel-max draw) with the confidence rule as a
parameter, then threshold / fallback / done on the device. ``reference`` holds the PyTorch versions
(the engine's ``choose_tokens`` / ``low_confidence_fill`` semantics)."""

from clover_agent.kernels.low_confidence.reference import LogitsAdjustment, StepResult, TokenChoice
from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.low_confidence.choose import (
        MAX_TOP_K,
        choose_tokens,
        low_confidence_step,
    )

__all__ = [
    "MAX_TOP_K",
    "LogitsAdjustment",
    "StepResult",
    "TokenChoice",
    "available",
    "choose_tokens",
    "low_confidence_step",
]
