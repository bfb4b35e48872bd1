"""The kernel part of ``gpu_bench.py``: every Triton kernel against its PyTorch reference at the
model's decoding-step shapes, through ``clover_agent.kernels.bench`` (the kernels' own benchmark
cases: random inputs cycling through copies, the bytes each must move at least, CUDA-event
medians with L2 flushed before each timed call, the PyTorch reference timed the same way). Added here: the error bound of the run's dtype, and each kernel's rate as a share of the
measured copy bandwidth.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from gpu_timing import Budget

from clover_agent.engine.model.config import CloverConfig

#: Vocabulary of the token-choice case when the kernels are interpreted.
INTERPRETER_VOCAB = 1024
#: Relative error bounds against the reference (run in the same dtype), per dtype of the run.
ERROR_BOUND = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}


def kernel_sizes(config: CloverConfig) -> Any:
    """The kernels' view of ``config`` (``clover_agent.kernels.bench.CloverSizes``)."""
    from clover_agent.kernels.bench import CloverSizes

    return CloverSizes(
        hidden=config.hidden_size,
        experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        moe_inner=config.moe_intermediate_size,
        shared_inner=config.shared_expert_intermediate_size,
        vocab=config.vocab_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rotary_dim=config.rotary_dim,
        gdn_key_heads=config.linear_num_key_heads,
        gdn_value_heads=config.linear_num_value_heads,
        gdn_key_dim=config.linear_key_head_dim,
        gdn_value_dim=config.linear_value_head_dim,
        conv_kernel=config.linear_conv_kernel_dim,
        right_conv_kernel=config.right_conv_kernel_size,
        block_size=config.block_size,
        mask_token_id=config.mask_token_id if config.mask_token_id is not None else config.vocab_size - 1,
        rms_eps=config.rms_norm_eps,
    )


def kernel_input_bytes(config: CloverConfig, dtype: torch.dtype) -> int:
    """About what the cases allocate at once: the MoE cases' expert weights dominate (one set per
    step size), then a float32 reference copy's worth."""
    element = torch.empty((), dtype=dtype).element_size()
    experts = 3 * config.num_experts * config.moe_intermediate_size * config.hidden_size
    return int(experts * (2 * element + 4) * 1.2)


def check_kernels(
    config: CloverConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    context: int,
    bandwidth: float | None,
    budget: Budget,
    repeats: int,
) -> dict[str, Any]:
    """``{"rows": [...]}`` (one per case), or ``{"unavailable": reason}`` where Triton cannot run.

    On a GPU: 32- and 64-token steps and a 4,096-token chunked prefill at the model's sizes.
    Elsewhere (the interpreter, which runs a kernel in seconds where a GPU takes microseconds): the
    32-token cases only, the vocabulary cut to :data:`INTERPRETER_VOCAB` and no sampled token choice,
    said so under ``"interpreter"``."""
    from clover_agent.kernels.runtime import triton_problem

    problem = triton_problem()
    if problem is not None:
        return {"unavailable": problem}
    from clover_agent.kernels.bench import measure
    from clover_agent.kernels.cases import cases

    cuda = device.type == "cuda"
    sizes = kernel_sizes(config)
    result: dict[str, Any] = {}
    if not cuda:
        vocab = min(sizes.vocab, INTERPRETER_VOCAB)
        sizes = dataclasses.replace(sizes, vocab=vocab, mask_token_id=min(sizes.mask_token_id, vocab - 1))
        result["interpreter"] = f"vocabulary cut to {vocab:,}; the sampled token choice not run"
    built = cases(
        device=str(device),
        dtype=dtype,
        sizes=sizes,
        tokens=(32, 64) if cuda else (32,),
        prefill_tokens=(4096,) if cuda else (),
        context=context,
        copies=2,
    )
    bound = ERROR_BOUND.get(dtype, 1e-2)
    rows: list[dict[str, Any]] = []
    for case in built:
        if not cuda and "sampling" in case.name:
            continue
        if not budget.allows(f"kernel {case.name}"):
            continue
        try:
            row = measure(case, warmup=3 if cuda else 0, repeats=repeats)
        except Exception as exc:  # a broken kernel is a finding of the run, not its end
            rows.append({"name": case.name, "shape": case.shape, "error": f"{type(exc).__name__}: {exc}"})
            continue
        error = row["relative_error"]
        row.update(bound=bound, within_bound=None if error is None else error <= bound)
        if bandwidth and row["gb_per_s"]:
            row["share_of_copy_bandwidth"] = row["gb_per_s"] * 1e9 / bandwidth
        rows.append(row)
    return {**result, "rows": rows}
