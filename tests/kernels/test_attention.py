"""The block-causal K/V-cache attention kernels against the PyTorch reference: awkward lengths and
head counts, cache rows past the step filled with NaN (they must never be read), the length read
from device memory."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels import attention
from clover_agent.kernels.attention import reference
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


def attention_inputs(
    steps: int, heads: int, kv_heads: int, head_dim: int, length: int, capacity: int, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE)

    k_cache = torch.full((capacity, kv_heads, head_dim), float("nan"), device=DEVICE)
    v_cache = torch.full((capacity, kv_heads, head_dim), float("nan"), device=DEVICE)
    k_cache[:length], v_cache[:length] = rand(length, kv_heads, head_dim), rand(length, kv_heads, head_dim)
    return {
        "q": rand(steps, heads, head_dim),
        "k_new": rand(steps, kv_heads, head_dim),
        "v_new": rand(steps, kv_heads, head_dim),
        "gate": rand(steps, heads, head_dim),
        "k_cache": k_cache,
        "v_cache": v_cache,
    }


@pytest.mark.parametrize(
    ("steps", "heads", "kv_heads", "head_dim", "length", "block_size", "splits"),
    [
        (5, 4, 2, 24, 19, 8, 3),  # a partial block of committed rows before the step
        (5, 4, 2, 24, 0, 8, 1),  # empty cache
        (1, 6, 2, 20, 33, 1, 4),  # one autoregressive token, causal
        (17, 4, 1, 16, 32, 32, 2),  # 68 (token, head) rows: two row tiles
        (9, 3, 3, 40, 16, 1, 5),  # no grouping, causal, more splits than key tiles
    ],
)
def test_attention_step_matches_reference(
    steps: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    length: int,
    block_size: int,
    splits: int,
    poisoned_allocations: None,
) -> None:
    t = attention_inputs(steps, heads, kv_heads, head_dim, length, capacity=length + steps + 7, seed=steps)
    k_want, v_want = t["k_cache"].clone(), t["v_cache"].clone()
    reference.write_kv(t["k_new"], t["v_new"], k_want, v_want, length)
    want = reference.block_attention(
        t["q"], k_want, v_want, length, block_size=block_size, scale=0.3, gate=t["gate"]
    )

    device_length = torch.tensor([length], device=DEVICE)
    attention.write_kv(t["k_new"], t["v_new"], t["k_cache"], t["v_cache"], device_length)
    assert torch.equal(t["k_cache"].nan_to_num(7.0), k_want.nan_to_num(7.0))  # exact: a copy of rows
    assert torch.equal(t["v_cache"].nan_to_num(7.0), v_want.nan_to_num(7.0))  # exact: a copy of rows
    got = attention.block_attention(
        t["q"], t["k_cache"], t["v_cache"], device_length, block_size=block_size, scale=0.3, gate=t["gate"],
        splits=splits,
    )  # fmt: skip
    # float32, O(1) values, <= 40-term dot products: the online softmax and split reduction reorder
    # sums (~1e-6); a wrong mask or row moves the output by O(0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_launch_serves_every_length(poisoned_allocations: None) -> None:
    """The length lives in device memory: changing it in place (as a replayed CUDA graph sees it)
    changes what the same call attends to."""
    capacity, steps = 48, 4
    t = attention_inputs(steps, 4, 2, 16, 40, capacity, seed=1)
    length = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    for committed in (8, 40, 13):
        length.fill_(committed)
        got = attention.attention_step(
            t["q"], t["k_new"], t["v_new"], t["k_cache"], t["v_cache"], length, block_size=8, scale=0.25
        )
        want = reference.block_attention(
            t["q"], t["k_cache"], t["v_cache"], committed, block_size=8, scale=0.25
        )
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32: as above


def test_attention_gate_from_a_projection_view(poisoned_allocations: None) -> None:
    """Query and gate as the two halves of q_proj's per-head rows (strided views)."""
    steps, heads, head_dim = 6, 4, 16
    t = attention_inputs(steps, heads, 2, head_dim, 10, 20, seed=2)
    projected = torch.randn(steps, heads, 2 * head_dim, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    query, gate = projected.chunk(2, dim=-1)
    attention.write_kv(t["k_new"], t["v_new"], t["k_cache"], t["v_cache"], torch.tensor([10], device=DEVICE))
    got = attention.block_attention(
        query,
        t["k_cache"],
        t["v_cache"],
        torch.tensor([10], device=DEVICE),
        block_size=32,
        scale=0.25,
        gate=gate,
    )
    want = reference.block_attention(
        query, t["k_cache"], t["v_cache"], 10, block_size=32, scale=0.25, gate=gate
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32: as above


def test_attention_half_precision(poisoned_allocations: None) -> None:
    t = {name: x.half() for name, x in attention_inputs(7, 4, 2, 32, 21, 30, seed=4).items()}
    length = torch.tensor([21], device=DEVICE)
    got = attention.attention_step(
        t["q"],
        t["k_new"],
        t["v_new"],
        t["k_cache"],
        t["v_cache"],
        length,
        block_size=8,
        scale=0.2,
        gate=t["gate"],
    )
    want = reference.block_attention(
        t["q"].float(),
        t["k_cache"].float(),
        t["v_cache"].float(),
        21,
        block_size=8,
        scale=0.2,
        gate=t["gate"].float(),
    )
    assert got.dtype == torch.float16
    # float16 inputs and output against a float32 reference: a few float16 roundings (2**-11 each)
    torch.testing.assert_close(got.float(), want, rtol=3e-3, atol=3e-3)


def test_attention_rejects_a_host_length() -> None:
    t = attention_inputs(2, 2, 1, 16, 3, 8, seed=0)
    with pytest.raises(ValueError, match="one-element integer tensor"):
        attention.write_kv(t["k_new"], t["v_new"], t["k_cache"], t["v_cache"], 3)  # type: ignore[arg-type]
