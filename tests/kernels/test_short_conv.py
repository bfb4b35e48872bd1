"""The short convolution kernel (causal taps from the conv state, block-local right taps, SiLU) against
the PyTorch reference, on shapes that are not multiples of the tiles."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels import short_conv
from clover_agent.kernels.short_conv import reference
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


def conv_inputs(steps: int, channels: int, kernel: int, right: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t = {
        "rows": torch.randn(steps, channels, generator=gen),
        "weight": torch.randn(channels, kernel, generator=gen),
        "state": torch.randn(channels, kernel - 1, generator=gen),
        "right_weight": torch.randn(channels, right, generator=gen),
    }
    return {name: x.to(DEVICE) for name, x in t.items()}


@pytest.mark.parametrize(("steps", "channels"), [(1, 5), (2, 300), (37, 70)])
def test_causal_conv1d_matches_reference(steps: int, channels: int, poisoned_allocations: None) -> None:
    t = conv_inputs(steps, channels, 4, 4, seed=steps)
    before = t["state"].clone()
    got = short_conv.causal_conv1d(t["rows"], t["weight"], t["state"])
    # float32, 4-tap sums (an activation after them): op order at most
    torch.testing.assert_close(
        got, reference.causal_conv1d(t["rows"], t["weight"], t["state"]), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(t["state"], before)  # exact: read-only


@pytest.mark.parametrize(("steps", "block_size", "right"), [(37, 8, 4), (40, 32, 3), (5, 4, 6), (33, 32, 4)])
def test_short_conv_with_right_taps_matches_reference(
    steps: int, block_size: int, right: int, poisoned_allocations: None
) -> None:
    t = conv_inputs(steps, 45, 4, right, seed=block_size)
    options = {"right_weight": t["right_weight"], "block_size": block_size, "activation": True}
    got = short_conv.short_conv(t["rows"], t["weight"], t["state"], **options)
    want = reference.short_conv(t["rows"], t["weight"], t["state"], **options)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32, <= 10-tap sums: op order


def test_short_conv_half_rows(poisoned_allocations: None) -> None:
    t = conv_inputs(19, 33, 4, 4, seed=3)
    rows, state = t["rows"].half(), t["state"].half()
    got = short_conv.short_conv(rows, t["weight"], state, t["right_weight"], 8, activation=True)
    want = reference.short_conv(
        rows.float(), t["weight"], state.float(), t["right_weight"], 8, activation=True
    )
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)  # a float16 output (2**-11)


def test_short_conv_rejects_bad_arguments() -> None:
    t = conv_inputs(3, 4, 4, 4, seed=0)
    with pytest.raises(ValueError, match="conv state must be"):
        short_conv.short_conv(t["rows"], t["weight"], t["state"][:, :2])
    with pytest.raises(ValueError, match="needs block_size"):
        short_conv.short_conv(t["rows"], t["weight"], t["state"], t["right_weight"])
