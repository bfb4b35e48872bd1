"""The benchmark cases: Clover's sizes as the engine's shipped config states them, and every case
runnable (tiny sizes on the CPU) with its Triton result close to its reference."""

from __future__ import annotations

import dataclasses

import torch

from clover_agent.engine.model.config import CloverConfig, full_size_config_json
from clover_agent.kernels.bench import CLOVER, CloverSizes, measure, relative_error
from clover_agent.kernels.cases import cases
from tests.kernels.helpers import DEVICE, requires_triton

#: Small enough for the interpreter, awkward enough to cross tiles.
TINY = CloverSizes(
    hidden=48,
    experts=6,
    top_k=2,
    moe_inner=40,
    shared_inner=40,
    vocab=100,
    heads=4,
    kv_heads=2,
    head_dim=16,
    gdn_key_heads=1,
    gdn_value_heads=2,
    gdn_key_dim=16,
    gdn_value_dim=16,
    block_size=8,
    mask_token_id=99,
)


def test_clover_sizes_are_the_shipped_config() -> None:
    raw = full_size_config_json()
    text = raw["text_config"]
    want = {
        "hidden": text["hidden_size"],
        "experts": text["num_experts"],
        "top_k": text["num_experts_per_tok"],
        "moe_inner": text["moe_intermediate_size"],
        "shared_inner": text["shared_expert_intermediate_size"],
        "vocab": text["vocab_size"],
        "heads": text["num_attention_heads"],
        "kv_heads": text["num_key_value_heads"],
        "head_dim": text["head_dim"],
        "rotary_dim": CloverConfig.from_dict(raw).rotary_dim,  # head_dim x partial_rotary_factor
        "gdn_key_heads": text["linear_num_key_heads"],
        "gdn_value_heads": text["linear_num_value_heads"],
        "gdn_key_dim": text["linear_key_head_dim"],
        "gdn_value_dim": text["linear_value_head_dim"],
        "conv_kernel": text["linear_conv_kernel_dim"],
        "right_conv_kernel": raw["right_conv_kernel_size"],
        "block_size": raw["block_size"],
        "mask_token_id": raw["mask_token_id"],
        "rms_eps": text["rms_norm_eps"],
    }
    assert dataclasses.asdict(CLOVER) == want
    assert CLOVER.conv_dim == CloverConfig.from_dict(raw).conv_dim


@requires_triton
def test_every_case_runs_and_matches_its_reference() -> None:
    built = cases(
        device=DEVICE, dtype=torch.float32, sizes=TINY, tokens=(6,), prefill_tokens=(20,), context=21
    )
    assert built
    for case in built:
        assert case.bytes_moved > 0 and case.shape
        got = case.run()
        if case.reference is not None:
            assert relative_error(got, case.reference()) < 1e-4, case.name


@requires_triton
def test_measure_reports_error_time_and_bandwidth() -> None:
    case = next(c for c in cases(device=DEVICE, dtype=torch.float32, sizes=TINY, tokens=(3,), prefill_tokens=())
                if c.name.startswith("short_conv"))  # fmt: skip
    row = measure(case, warmup=1, repeats=2)
    assert row["name"] == case.name and row["bytes"] == case.bytes_moved
    assert row["median_ms"] > 0 and row["gb_per_s"] > 0
    assert row["relative_error"] < 1e-5
    # The PyTorch reference timed beside it, in the same run.
    assert row["reference_ms"] > 0 and row["speedup"] == row["reference_ms"] / row["median_ms"]
    assert "reference_ms" not in measure(case, warmup=0, repeats=1, time_reference=False)
