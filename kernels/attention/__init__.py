"""Block-causal gated attention over a preallocated K/V cache: the step's K/V written in place past
the committed length, a split-K flash kernel reading that length from device memory (GQA without
repeating K/V), and the output gate in the combine. ``reference`` holds the PyTorch versions."""

from clover_agent.kernels.runtime import available, triton_problem

if triton_problem() != "triton is not installed":
    from clover_agent.kernels.attention.kv_attention import (
        attention_step,
        block_attention,
        splits_for,
        write_kv,
    )

__all__ = ["attention_step", "available", "block_attention", "splits_for", "write_kv"]
