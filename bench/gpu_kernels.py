"""Operator checks of ``gpu_bench.py``: each operator the engine would run on this device, at one
decoding step's shapes of the model, against its float32 PyTorch reference and timed.

For every operator of ``clover_agent.engine.ops``: the implementation ``kernels="auto"`` picks
(Triton where it exists on CUDA, else PyTorch) runs in the bench dtype on rotating inputs; the
reference runs in float32 on the same values. Reported: backend, relative error (max |a - r| /
max |r|) against its bound, median time, the bytes the operator must move at least (inputs read
and outputs written; for the experts only the experts the step routes to) and that rate as a
share of the measured copy bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from gpu_timing import Budget, median_seconds

from clover_agent.engine import ops
from clover_agent.engine.config import CloverConfig

#: Relative error bounds against the float32 reference, per dtype of the run.
ERROR_BOUND = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}
#: Input sets cycled through while timing (an operator should not find its inputs in L2).
ROTATIONS = 3


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def operator_cases(
    config: CloverConfig, tokens: int, context: int, device: torch.device, dtype: torch.dtype, seed: int
) -> dict[str, tuple[tuple[Any, ...], int]]:
    """Per operator: (positional arguments, minimum bytes moved) for one step of ``tokens`` after
    ``context`` committed ones."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dt)

    hidden, heads, kv_heads, head = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    experts, top_k = config.num_experts, config.num_experts_per_tok
    inner, conv = config.moe_intermediate_size, config.conv_dim
    cases: dict[str, tuple[tuple[Any, ...], int]] = {}

    x, w = randn(tokens, hidden), randn(hidden, scale=0.1)
    cases["rms_norm"] = ((x, w, config.rms_norm_eps), 2 * _bytes(x) + _bytes(w))
    y, gate, wv = randn(tokens, hv, dv), randn(tokens, hv, dv), randn(dv, scale=0.1) + 1
    cases["gated_rms_norm"] = ((y, gate, wv, config.rms_norm_eps), 3 * _bytes(y) + _bytes(wv))
    rows, cw, cs = randn(tokens, conv), randn(conv, config.linear_conv_kernel_dim, scale=0.5), randn(conv, 3)
    cases["causal_conv1d"] = ((rows, cw, cs), 2 * _bytes(rows) + _bytes(cw, cs))
    q, k = (
        F.normalize(randn(tokens, hk, dk).float(), dim=-1),
        F.normalize(randn(tokens, hk, dk).float(), dim=-1),
    )
    v, g = randn(tokens, hv, dv), -torch.rand(tokens, hv, generator=gen, device=device) * 0.5
    beta, state = (
        torch.rand(tokens, hv, generator=gen, device=device),
        randn(hv, dk, dv, scale=0.1, dt=torch.float32),
    )
    q, k = q.to(dtype), k.to(dtype)
    cases["gated_delta_rule"] = (
        (q, k, v, g, beta, state, dk**-0.5),
        _bytes(q, k, v, g, beta) + 2 * _bytes(state) + _bytes(v) * 2,
    )
    aq = randn(tokens, heads, head)
    keys, values = randn(context + tokens, kv_heads, head), randn(context + tokens, kv_heads, head)
    cases["attention"] = (
        (aq, keys, values, context, config.block_size, 0, head**-0.5),
        2 * _bytes(aq) + _bytes(keys, values),
    )
    mx = randn(tokens, hidden)
    ids = torch.stack([torch.randperm(experts, generator=gen, device=device)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(randn(tokens, top_k, dt=torch.float32), dim=-1).to(dtype)
    gate_up, down = (
        randn(experts, 2 * inner, hidden, scale=hidden**-0.5),
        randn(experts, hidden, inner, scale=inner**-0.5),
    )
    used = int(ids.unique().numel())
    per_expert = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    cases["moe_experts"] = ((mx, ids, weights, gate_up, down), used * per_expert + 2 * _bytes(mx))
    return cases


def operator_input_bytes(config: CloverConfig, context: int, dtype: torch.dtype) -> int:
    """About what :func:`check_operators` allocates: every rotation's inputs (the routed experts'
    weights dominate) plus one float32 copy for the reference."""
    element = torch.empty((), dtype=dtype).element_size()
    experts = 3 * config.num_experts * config.moe_intermediate_size * config.hidden_size
    cache = 2 * (context + config.block_size) * config.num_key_value_heads * config.head_dim
    per_rotation = (experts + cache) * element
    return ROTATIONS * per_rotation + (experts + cache) * 4


def _as_float32(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _first(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, tuple) else result


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float(
        (actual.double() - expected.double()).abs().max() / expected.double().abs().max().clamp_min(1e-30)
    )


def check_operators(
    config: CloverConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    tokens: int,
    context: int,
    bandwidth: float | None,
    budget: Budget,
    repeats: int,
) -> list[dict[str, Any]]:
    """One row per operator (see the module doc); a failing operator is a row with ``error``."""
    table = ops.resolve_ops("auto", device)
    inputs = [operator_cases(config, tokens, context, device, dtype, seed) for seed in range(ROTATIONS)]
    rows: list[dict[str, Any]] = []
    for name in ops.OP_NAMES:
        if not budget.allows(f"operator {name}"):
            continue
        fn: Callable[..., Any] = getattr(table, name)
        reference: Callable[..., Any] = ops._REGISTRY[name]["torch"]
        args, moved = inputs[0][name]
        row: dict[str, Any] = {"op": name, "backend": table.backends[name], "bytes": moved}
        try:
            error = relative_error(_first(fn(*args)), _first(reference(*_as_float32(args))))
            seconds, calls = median_seconds(
                lambda case, fn=fn, name=name: fn(*case[name][0]),
                inputs,
                device,
                repeats=repeats,
                budget=budget,
            )
        except Exception as exc:  # a broken kernel is a finding of the run, not its end
            row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            continue
        bound = ERROR_BOUND.get(dtype, 1e-2)
        row.update(
            relative_error=error,
            bound=bound,
            within_bound=error <= bound,
            median_us=seconds * 1e6,
            calls=calls,
            gb_per_s=moved / seconds / 1e9,
        )
        if bandwidth:
            row["share_of_copy_bandwidth"] = moved / seconds / bandwidth
        rows.append(row)
    return rows
