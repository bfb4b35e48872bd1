"""The RMS norm kernels (zero-centred, after the residual add, gated, and the GDN branch-mix epilogue) against the PyTorch
reference, on row sizes that are not powers of two."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels import norms
from clover_agent.kernels.norms import reference
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("shape", [(7, 3, 20), (1, 100), (5, 2048)])
def test_rms_norm_matches_reference(shape: tuple[int, ...], poisoned_allocations: None) -> None:
    x, w = rand(*shape, seed=1), rand(shape[-1], seed=2)
    # float32 mean of squares over <= 2048 elements, tree vs linear order: ~1e-6 relative
    torch.testing.assert_close(
        norms.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5
    )


def test_rms_norm_strided_rows(poisoned_allocations: None) -> None:
    """Per-head q norm on a view of a projection (rows not contiguous)."""
    x, w = rand(6, 4, 2 * 24, seed=3)[..., :24], rand(24, seed=4)
    torch.testing.assert_close(  # float32: as above
        norms.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_matches_reference(dtype: torch.dtype, poisoned_allocations: None) -> None:
    """The residual add and the next norm in one launch: the sum as PyTorch's add rounds it (exact),
    the norm of that rounded sum."""
    x, delta, w = rand(7, 3, 100, seed=8).to(dtype), rand(7, 3, 100, seed=9).to(dtype), rand(100, seed=10)
    total, normed = norms.add_rms_norm(x, delta, w.to(dtype), 1e-6)
    want_total, want_normed = reference.add_rms_norm(x, delta, w.to(dtype), 1e-6)
    assert total.dtype == normed.dtype == dtype
    assert torch.equal(total, want_total)  # exact: one float32 add of two values, rounded once, as PyTorch
    # float32 sums in another order (1e-5); float16 outputs: a rounding of 2**-11 relative (2e-3)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(normed, want_normed, rtol=tolerance, atol=tolerance)
    with pytest.raises(ValueError, match="delta must match x"):
        norms.add_rms_norm(x, delta[:, :2], w.to(dtype), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_rotary_matches_reference(dtype: torch.dtype, poisoned_allocations: None) -> None:
    """The q norm and partial rotary on a strided view of the projection (query then gate per head)."""
    tokens, heads, size, rot = 5, 3, 40, 16
    x = rand(tokens, heads, 2 * size, seed=11).to(dtype)[..., :size]
    w = rand(size, seed=12).to(dtype)
    angles = torch.arange(7, 7 + tokens).float()[:, None] * (0.3 ** torch.arange(rot // 2).float())[None, :]
    angles = torch.cat([angles, angles], dim=-1).to(DEVICE)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    got = norms.rms_norm_rotary(x, w, 1e-6, cos, sin)
    want = reference.rms_norm_rotary(x, w, 1e-6, cos, sin)
    assert got.dtype == dtype and got.shape == want.shape
    # float32: sums in another order (1e-5). float16: the reference rounds after each multiply and
    # the add, the kernel once at the end: up to two roundings of 2**-11 on values up to ~4 (4e-3)
    tolerance = 1e-5 if dtype == torch.float32 else 4e-3
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    with pytest.raises(ValueError, match="cos / sin must be"):
        norms.rms_norm_rotary(x, w, 1e-6, cos[:, :15], sin[:, :15])


def test_gated_rms_norm_matches_reference(poisoned_allocations: None) -> None:
    x, gate, w = rand(9, 3, 36, seed=5), rand(9, 3, 36, seed=6), rand(36, seed=7)
    got = norms.gated_rms_norm(x, gate, w, 1e-6)
    want = reference.gated_rms_norm(x, gate, w, 1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32: as above, times a sigmoid


@pytest.mark.parametrize("mix", [True, False])
def test_gdn_output_matches_reference(mix: bool, poisoned_allocations: None) -> None:
    forward, backward, z = rand(11, 5, 24, seed=8), rand(11, 5, 24, seed=9), rand(11, 5, 24, seed=10).half()
    w, logits = rand(24, seed=11), rand(5, 2, seed=12)
    extra = (backward, logits) if mix else ()
    got = norms.gdn_output(forward, z, w, 1e-6, *extra)
    want = reference.gdn_output(forward, z.float(), w, 1e-6, *extra)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)  # float16 z and output: 2**-11 each
