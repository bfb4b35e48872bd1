"""The engine's own PyTorch operators (attention over the cache, the routed experts' fixed grid)
against explicit computations on awkward shapes, and the kernel registry. The operators whose
PyTorch version is a ``clover_agent.kernels`` reference are tested in tests/kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clover_agent.engine import ops
from clover_agent.engine.errors import EngineArgumentError
from clover_agent.engine.ops import torch_ops


def allowed_by_position(steps: int, past: int, block_size: int, block_from: int | None) -> torch.Tensor:
    """[T, past+T] mask written out from the rule: causal, plus same block for rows >= block_from."""
    query = torch.arange(past, past + steps)[:, None]
    key = torch.arange(past + steps)[None, :]
    same_block = (query // block_size == key // block_size) & (
        torch.arange(steps)[:, None] >= (steps if block_from is None else block_from)
    )
    return (key <= query) | same_block


@pytest.mark.parametrize(
    ("steps", "past", "block_from"),
    [(5, 7, None), (1, 9, None), (20, 16, 0), (13, 8, 0), (24, 0, 8), (3, 0, 0), (17, 8, 16)],
)
def test_attention_on_the_cache_matches_explicit_softmax(
    steps: int, past: int, block_from: int | None
) -> None:
    """Causal (any offset), block-causal (full and partial blocks) and causal-then-block rows."""
    gen = torch.Generator().manual_seed(steps + past)
    block_size = 8
    q = torch.randn(steps, 4, 8, generator=gen)
    capacity = past + steps + 5  # spare rows past the new ones hold garbage that must not be read
    key_buffer, value_buffer = (
        torch.randn(capacity, 2, 8, generator=gen),
        torch.randn(capacity, 2, 8, generator=gen),
    )
    allowed = allowed_by_position(steps, past, block_size, block_from)
    kk = key_buffer[: past + steps].repeat_interleave(2, dim=1)
    vv = value_buffer[: past + steps].repeat_interleave(2, dim=1)
    scores = torch.einsum("thd,shd->hts", q, kk) * 0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hts,shd->thd", probs, vv)
    out = torch_ops.attention(q, key_buffer, value_buffer, past, block_size, block_from, 0.5)
    # float32, 8-dim heads and <= 50 keys: grouped matmuls vs einsum reorder the sums (~1e-7 on O(1))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    # The context length read from device memory (a CUDA-graph step): every buffer row is masked.
    on_device = torch_ops.attention(
        q, key_buffer, value_buffer, torch.tensor(past), block_size, block_from, 0.5
    )
    torch.testing.assert_close(on_device, expected, rtol=1e-5, atol=1e-6)  # as above
    gate = torch.randn(q.shape, generator=gen)
    gated = torch_ops.attention(q, key_buffer, value_buffer, past, block_size, block_from, 0.5, gate)
    torch.testing.assert_close(gated, expected * torch.sigmoid(gate), rtol=1e-5, atol=1e-6)  # as above


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k"),
    [(11, 5, 2), (1, 16, 3), (3, 16, 2), (70, 6, 2), (300, 7, 3), (1100, 4, 2)],
)
def test_moe_experts_matches_per_token_loop(tokens: int, experts: int, top_k: int) -> None:
    """Few tokens (fixed grid, fewer slots than experts or all of them), a packed batch's worth
    (padded to the busiest expert) and many (one expert at a time)."""
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 6, generator=gen)
    gate_up, down = torch.randn(experts, 8, 6, generator=gen), torch.randn(experts, 6, 4, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    expected = torch.zeros_like(x)
    for n in range(tokens):
        for j in range(top_k):
            e = int(ids[n, j])
            gate, up = (gate_up[e] @ x[n]).chunk(2)
            expected[n] += weights[n, j] * (down[e] @ (F.silu(gate) * up))
    # float32 batched vs one token at a time: op order; outputs up to ~60 are off by a few of their
    # ulps (4e-6 each) even where the result itself is small, hence the absolute 1e-4
    torch.testing.assert_close(
        torch_ops.routed_experts(x, ids, weights, gate_up, down), expected, rtol=1e-5, atol=1e-4
    )


def test_moe_fixed_grid_ignores_what_unrouted_experts_compute() -> None:
    """An expert no token routes to may produce inf; it must not reach the output (0 * inf is NaN)."""
    x = torch.ones(2, 4)
    gate_up, down = torch.ones(4, 6, 4), torch.ones(4, 4, 3)
    gate_up[3] = float("inf")
    ids, weights = torch.tensor([[0, 1], [1, 2]]), torch.full((2, 2), 0.5)
    out = torch_ops.routed_experts(x, ids, weights, gate_up, down)
    assert torch.isfinite(out).all()


def test_kernel_choices() -> None:
    auto = ops.resolve_ops("auto")
    assert auto.backend == "torch" and set(auto.backends) == set(ops.OP_NAMES)
    assert ops.resolve_ops("torch").attention is torch_ops.attention
    with pytest.raises(
        EngineArgumentError, match="kernels='triton' on cuda: no usable implementation of rms_norm"
    ):
        ops.resolve_ops("triton", "cuda")  # no CUDA device here
    with pytest.raises(EngineArgumentError, match="unknown kernels choice 'cuda'"):
        ops.resolve_ops("cuda")
    with pytest.raises(EngineArgumentError, match="unknown operator\\(s\\) softmax"):
        ops.resolve_ops({"softmax": "torch"})
    mapped = ops.resolve_ops({"attention": "torch"})
    assert mapped.backends["attention"] == "torch" and mapped.backend == "torch"
