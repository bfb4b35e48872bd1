"""Quantised experts (kernels/moe/quant.py): the formats' round-trip error bounds, their byte layout,
and the reference MoE on quantised weights against the plain reference on the dequantised ones."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels import moe
from clover_agent.kernels.moe import quant, reference
from tests.kernels.helpers import DEVICE, requires_triton


def _weights(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=gen)
    w[..., 0, :3] *= 40.0  # outliers: blocks whose scale is set by one large element
    return w


@pytest.mark.parametrize(("shape", "block"), [((3, 70, 45), (16, 32)), ((2, 130, 300), (128, 128))])
def test_fp8_round_trip_is_within_half_an_e4m3_step(shape: tuple[int, ...], block: tuple[int, int]) -> None:
    w = _weights(*shape, seed=1)
    data, scale = quant.quantize_fp8(w, block)
    assert data.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == (shape[0], *quant.scale_grid(shape[1], shape[2], block))
    back = quant.dequantize_fp8(data, scale, block, torch.float32)
    # e4m3 keeps 3 mantissa bits: round to nearest is off by at most 2**-4 of the value for normal
    # numbers, and by half the subnormal step (2**-10 in scaled units) below 2**-6; float32 slack.
    per_element = quant._expand(scale, w.shape, block)
    bound = torch.maximum(w.abs() * 2**-4, per_element * 2**-10) * (1 + 1e-6)
    assert ((back - w).abs() <= bound).all()
    # each block's largest magnitude maps onto the top of the range (448), so nothing is clipped
    assert data.float().abs().amax() == quant.FP8_MAX


@pytest.mark.parametrize(("shape", "group"), [((3, 7, 45), 16), ((2, 5, 256), 128)])
def test_int4_round_trip_is_within_half_a_step(shape: tuple[int, ...], group: int) -> None:
    w = _weights(*shape, seed=2)
    data, scale = quant.quantize_int4(w, group)
    assert data.dtype == torch.uint8 and data.shape == (*shape[:2], (shape[2] + 1) // 2)
    assert scale.dtype == torch.float16 and scale.shape == (*shape[:2], -(-shape[2] // group))
    back = quant.dequantize_int4(data, scale, group, shape[2], torch.float32)
    # round to nearest on a grid of step s: half a step; the float16 scale (2**-11 relative) can
    # push the group's largest element just past 7 steps, where it is clipped: 7 * 2**-11 more.
    step = quant._expand(scale.float(), w.shape, (1, group))
    assert ((back - w).abs() <= step * (0.5 + 7 * 2**-11)).all()


def test_int4_packing_layout() -> None:
    """Two per byte along K, element 2j low; stored as q + 8; an odd K padded with a zero (8)."""
    w = torch.tensor([[[1.0, -7.0, 7.0, 0.0, -3.0]]])  # one group: scale 1
    data, scale = quant.quantize_int4(w, group=16)
    assert scale.tolist() == [[[1.0]]]
    assert data.tolist() == [[[(8 + 1) | (1 << 4), 15 | (8 << 4), 5 | (8 << 4)]]]


@pytest.mark.parametrize("scheme", quant.SCHEMES)
def test_fused_gate_up_has_a_grid_per_half(scheme: str) -> None:
    """gate rows and up rows are quantised as two matrices, as gate_proj and up_proj are stored."""
    w = _weights(2, 2 * 40, 48, seed=3)
    q = quant.quantize(w, scheme, halves=2, group=16, block=(16, 32))
    for half, rows in enumerate((slice(0, 40), slice(40, 80))):
        data, scale = quant.quantize_one(w[:, rows], scheme, group=16, block=(16, 32))
        assert torch.equal(q.data[:, rows].view(torch.uint8), data.view(torch.uint8))  # exact: same bytes
        grid = scale.shape[1]
        assert torch.equal(q.scale[:, half * grid : (half + 1) * grid], scale)  # exact: same scales
    assert q.shape == w.shape
    assert q.expert(1, torch.float32).shape == w.shape[1:]


@pytest.mark.parametrize("scheme", quant.SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_moe_on_quantised_experts_is_the_moe_on_their_dequantised_weights(
    scheme: str, dtype: torch.dtype
) -> None:
    tokens, hidden, inner, experts, top_k = 23, 70, 40, 6, 3
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    ids, weights = reference.route(torch.randn(tokens, experts, generator=gen).to(dtype), top_k)
    gate_up = quant.quantize(
        _weights(experts, 2 * inner, hidden, seed=5) * hidden**-0.5, scheme, halves=2, group=32
    )
    down = quant.quantize(_weights(experts, hidden, inner, seed=6) * inner**-0.5, scheme, group=32)
    got = reference.moe_experts(x, ids, weights, gate_up, down)
    want = reference.moe_experts(x, ids, weights, gate_up.dequantize(dtype), down.dequantize(dtype))
    assert got.dtype == dtype
    # the same per-expert matmuls on bit-identical weights; only BLAS's blocking, which may depend
    # on a tensor's layout (a slice of the stack against a fresh matrix) and on the CPU, could
    # reorder the sums: 1e-5 leaves room for that on any CPU; a wrong scale moves outputs of
    # order 1 by far more
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and the dequantised weights are the quantised format's own: one rounding to dtype
    dense = quant.as_dense(down, dtype)
    assert torch.equal(dense, down.dequantize(dtype))  # exact: the same function twice
    assert quant.as_dense(dense, dtype) is dense


def test_unknown_scheme_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown expert quantisation"):
        quant.quantize(torch.zeros(1, 2, 2), "int3")


# --- the Triton kernels (interpreted on the CPU) ---------------------------------------------------

FORMATS = {"fp8": {"block": (16, 32)}, "int4": {"group": 32}}  # scale blocks smaller than the shapes


def _quantised_moe(
    scheme: str, tokens: int, hidden: int, inner: int, experts: int, top_k: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, quant.QuantizedWeight, quant.QuantizedWeight]:
    gen = torch.Generator().manual_seed(hidden + inner)
    x = torch.randn(tokens, hidden, generator=gen)
    ids, weights = reference.route(torch.randn(tokens, experts, generator=gen) * 2, top_k)
    gate_up = quant.quantize(
        _weights(experts, 2 * inner, hidden, seed=7) * hidden**-0.5, scheme, halves=2, **FORMATS[scheme]
    )
    down = quant.quantize(_weights(experts, hidden, inner, seed=8) * inner**-0.5, scheme, **FORMATS[scheme])
    on = {f: getattr(gate_up, f).to(device) for f in ("data", "scale")}
    gate_up = quant.QuantizedWeight(scheme, on["data"], on["scale"], gate_up.block, gate_up.cols, 2)
    down = quant.QuantizedWeight(scheme, down.data.to(device), down.scale.to(device), down.block, down.cols)
    return x.to(device), ids.to(device), weights.to(device), gate_up, down


@requires_triton
@pytest.mark.parametrize("scheme", quant.SCHEMES)
@pytest.mark.parametrize(
    ("tokens", "hidden", "inner", "experts", "top_k"),
    [(11, 71, 40, 5, 2), (3, 48, 24, 7, 3)],  # odd K (int4 padding), partial scale blocks, gate/up grids
)
def test_kernels_read_quantised_experts(
    scheme: str, tokens: int, hidden: int, inner: int, experts: int, top_k: int, poisoned_allocations: None
) -> None:
    x, ids, weights, gate_up, down = _quantised_moe(scheme, tokens, hidden, inner, experts, top_k, DEVICE)
    got = moe.moe_experts(x, ids, weights, gate_up, down)
    want = reference.moe_experts(x, ids, weights, gate_up.dequantize(x.dtype), down.dequantize(x.dtype))
    # float32: the kernel's dequantised tiles are the reference's weights bit for bit (the same
    # float32 product, no rounding after); what is left is the grouped GEMM's summation order
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@requires_triton
@pytest.mark.parametrize("scheme", quant.SCHEMES)
def test_kernels_read_quantised_experts_with_half_activations(
    scheme: str, poisoned_allocations: None
) -> None:
    x, ids, weights, gate_up, down = _quantised_moe(scheme, 9, 40, 24, 4, 2, DEVICE)
    got = moe.moe_experts(x.half(), ids, weights.half(), gate_up, down)
    assert got.dtype == torch.float16
    deq = [w.dequantize(torch.float16).float() for w in (gate_up, down)]  # the tiles the kernel multiplies
    want = reference.moe_experts(x.half().float(), ids, weights.half().float(), *deq)
    # w8a16 / w4a16: float16 weights and activations, float32 sums, the inner activations and the
    # output rounded to float16 (2**-11 each) on O(1) values; a wrong scale moves it by O(1)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@requires_triton
def test_sparse_moe_with_quantised_experts(poisoned_allocations: None) -> None:
    x, _, _, gate_up, down = _quantised_moe("int4", 7, 33, 20, 3, 2, DEVICE)
    gen = torch.Generator().manual_seed(9)
    logits, shared, residual = (torch.randn(7, n, generator=gen).to(DEVICE) for n in (3, 33, 33))
    got = moe.sparse_moe(x, logits, 2, gate_up, down, shared=shared, residual=residual)
    dense = gate_up.dequantize(x.dtype), down.dequantize(x.dtype)
    want = reference.sparse_moe(x, logits, 2, *dense, shared=shared, residual=residual)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32: as above


@requires_triton
def test_kernels_refuse_a_scale_block_they_cannot_step_through() -> None:
    x, ids, weights, gate_up, _ = _quantised_moe("int4", 2, 32, 16, 2, 1, DEVICE)
    odd = quant.quantize(torch.randn(2, 32, 16), "int4", group=24)
    with pytest.raises(ValueError, match="power-of-two scale block"):
        moe.moe_experts(x, ids, weights, gate_up, odd)
