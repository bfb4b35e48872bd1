"""The fused MoE kernels against the PyTorch reference, on shapes that are not multiples of the tiles."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels import moe
from clover_agent.kernels.moe import reference
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


def random_moe(tokens: int, hidden: int, inner: int, experts: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    return {
        "x": randn(tokens, hidden),
        "router_logits": randn(tokens, experts, scale=2.0),
        "gate_up_proj": randn(experts, 2 * inner, hidden, scale=hidden**-0.5),
        "down_proj": randn(experts, hidden, inner, scale=inner**-0.5),
        "shared": randn(tokens, hidden),
        "shared_gate_logits": randn(tokens, 1),
        "residual": randn(tokens, hidden),
    }


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(13, 7, 3), (1, 9, 2), (40, 256, 8)])
def test_route_matches_reference(tokens: int, experts: int, top_k: int, poisoned_allocations: None) -> None:
    logits = random_moe(tokens, 8, 8, experts, seed=tokens)["router_logits"]
    ids, weights = moe.route(logits, top_k)
    want_ids, want_weights = reference.route(logits, top_k)
    assert ids.dtype == torch.int64 and weights.dtype == logits.dtype
    assert torch.equal(ids, want_ids)  # exact: expert ids (randn logits: no near tie at the top-k boundary)
    # float32 softmax over <= 256 experts, renormalised; the interpreter's exp is numpy's: a few ulps
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)


def test_route_softmax_is_float32_for_half_logits(poisoned_allocations: None) -> None:
    logits = random_moe(17, 8, 8, 33, seed=5)["router_logits"].half()
    ids, weights = moe.route(logits, 4)
    want_ids, want_weights = reference.route(logits, 4)
    assert weights.dtype == torch.float16
    assert torch.equal(ids, want_ids)  # exact: expert ids, as above
    torch.testing.assert_close(weights, want_weights, rtol=1e-3, atol=1e-3)  # float16 weights (2**-11)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "block_m"), [(11, 5, 2, 16), (30, 3, 2, 16), (7, 12, 4, 32)]
)
def test_align_pairs_matches_reference(
    tokens: int, experts: int, top_k: int, block_m: int, poisoned_allocations: None
) -> None:
    logits = random_moe(tokens, 8, 8, experts, seed=experts)["router_logits"]
    logits[:, 0] -= 100.0  # expert 0 never chosen: a zero-count expert
    ids, _ = reference.route(logits, top_k)
    got = moe.align_pairs(ids, experts, block_m)
    want = reference.align_pairs(ids, experts, block_m)
    used = int(want[2])
    assert int(got[2]) == used and used % block_m == 0
    assert torch.equal(got[0][:used], want[0][:used])  # exact: pair indices
    assert torch.equal(got[1][: used // block_m], want[1][: used // block_m])  # exact: expert ids
    assert got[0].numel() == want[0].numel() and got[1].numel() == want[1].numel()


@pytest.mark.parametrize("tokens", [32, 64])
def test_a_decoding_step_reads_each_touched_expert_once(tokens: int) -> None:
    """At the model's decoding shapes (a 32-token block, the fused 64-token step; top-8 of 256
    experts) the launch's tiles hold each touched expert once, so the grouped GEMMs read its
    weights once a step (an expert with more pairs than a tile's rows would take a second tile)."""
    from clover_agent.kernels.moe.tiles import tiles_for

    logits = random_moe(tokens, 8, 8, 256, seed=tokens)["router_logits"]
    ids, _ = moe.route(logits, 8)
    tiles = tiles_for(
        tokens, experts=256, hidden=2048, inner=512, top_k=8, dtype=torch.bfloat16, quant="none",
        device=torch.device("cpu"),
    )  # fmt: skip
    _, block_experts, num_padded = moe.align_pairs(ids, 256, tiles.block_m)
    used = block_experts[: int(num_padded) // tiles.block_m].tolist()
    assert sorted(used) == sorted(set(ids.flatten().tolist()))  # one tile per touched expert
    assert tiles.block_m == 16  # and 16-row tiles: a pair or two an expert, little padding


def test_align_pairs_reference_groups_pairs_stably() -> None:
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    sorted_pairs, block_experts, num_padded = reference.align_pairs(ids, 4, 4)
    # expert 0: pairs 1, 4; expert 1: pair 3; expert 2: pairs 0, 2, 5; expert 3: none
    assert int(num_padded) == 12
    assert sorted_pairs[:12].tolist() == [1, 4, 6, 6, 3, 6, 6, 6, 0, 2, 5, 6]
    assert block_experts[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("tokens", "hidden", "inner", "experts", "top_k"),
    [(11, 70, 40, 5, 2), (1, 24, 20, 9, 3), (37, 33, 72, 3, 2)],
)
def test_moe_experts_matches_reference(
    tokens: int, hidden: int, inner: int, experts: int, top_k: int, poisoned_allocations: None
) -> None:
    t = random_moe(tokens, hidden, inner, experts, seed=hidden)
    ids, weights = reference.route(t["router_logits"], top_k)
    got = moe.moe_experts(t["x"], ids, weights, t["gate_up_proj"], t["down_proj"])
    want = reference.moe_experts(t["x"], ids, weights, t["gate_up_proj"], t["down_proj"])
    # float32, <= 72-term dot products in a grouped GEMM vs per-expert F.linear: op order (~1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parts", ["all", "no_gate", "routed_only"])
def test_sparse_moe_matches_reference(parts: str, poisoned_allocations: None) -> None:
    t = random_moe(19, 45, 24, 6, seed=3)
    extra = {"shared": t["shared"], "shared_gate_logits": t["shared_gate_logits"], "residual": t["residual"]}
    if parts == "no_gate":
        extra["shared_gate_logits"] = None
    if parts == "routed_only":
        extra = {}
    args = (t["x"], t["router_logits"], 3, t["gate_up_proj"], t["down_proj"])
    got = moe.sparse_moe(*args, **extra)
    want = reference.sparse_moe(*args, **extra)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32: as above


def test_moe_experts_half_precision(poisoned_allocations: None) -> None:
    t = {k: v.half() for k, v in random_moe(9, 40, 24, 4, seed=8).items()}
    ids, weights = reference.route(t["router_logits"], 2)
    got = moe.moe_experts(t["x"], ids, weights, t["gate_up_proj"], t["down_proj"])
    want = reference.moe_experts(
        *(v.float() for v in (t["x"],)),
        ids,
        weights.float(),
        t["gate_up_proj"].float(),
        t["down_proj"].float(),
    )
    assert got.dtype == torch.float16
    # float16 weights and activations through two GEMMs against float32: float16 roundings of O(1)
    # sums (2**-11 each) add up; a wrong expert or weight moves the output by O(1)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_moe_experts_rejects_mismatched_shapes() -> None:
    t = random_moe(3, 16, 8, 2, seed=0)
    ids, weights = reference.route(t["router_logits"], 1)
    with pytest.raises(ValueError, match="moe shapes disagree"):
        moe.moe_experts(t["x"][:, :8], ids, weights, t["gate_up_proj"], t["down_proj"])
