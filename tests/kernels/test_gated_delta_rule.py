"""The gated delta rule kernels (step by step and chunked, with the bidirectional branch and the norm
epilogue) against the PyTorch reference, on shapes that are not multiples of the tiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clover_agent.kernels import gated_delta_rule as gdr
from clover_agent.kernels.gated_delta_rule import reference
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


def delta_inputs(
    steps: int, key_heads: int, value_heads: int, head_k: int, head_v: int, decay: float, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    t = {
        "q": F.normalize(rand(steps, key_heads, head_k), dim=-1),
        "k": F.normalize(rand(steps, key_heads, head_k), dim=-1),
        "v": rand(steps, value_heads, head_v),
        "g": -torch.rand(steps, value_heads, generator=gen) * decay,
        "beta": torch.rand(steps, value_heads, generator=gen),
        "state": rand(value_heads, head_k, head_v),
    }
    return {name: x.to(DEVICE) for name, x in t.items()}


def net_inputs(steps: int, value_heads: int, head_v: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 100)
    t = {
        "z": torch.randn(steps, value_heads, head_v, generator=gen),
        "norm_weight": torch.rand(head_v, generator=gen) + 0.5,
        "mix_logits": torch.randn(value_heads, 2, generator=gen),
    }
    return {name: x.to(DEVICE) for name, x in t.items()}


@pytest.mark.parametrize(
    ("steps", "heads", "dims", "decay", "method"),
    [
        (1, (1, 1), (8, 6), 0.05, "recurrent"),
        (19, (1, 2), (12, 10), 3.0, "recurrent"),
        (45, (1, 2), (12, 10), 3.0, "chunk"),
        (33, (2, 2), (20, 18), 0.05, "chunk"),
    ],
)
def test_gated_delta_rule_matches_reference(
    steps: int,
    heads: tuple[int, int],
    dims: tuple[int, int],
    decay: float,
    method: str,
    poisoned_allocations: None,
) -> None:
    t = delta_inputs(steps, *heads, *dims, decay=decay, seed=steps)
    before = t["state"].clone()
    out, final = gdr.gated_delta_rule(**t, scale=0.3, method=method)
    want_out, want_final = reference.gated_delta_rule(**t, scale=0.3)
    assert out.dtype == final.dtype == torch.float32
    # float32: the kernel's chunked scan and triangular solve reorder the reference's sums (~1e-6 on
    # O(1) values); a wrong decay or state update moves them by O(0.1)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, want_final, rtol=1e-5, atol=1e-5)
    assert torch.equal(t["state"], before)  # exact: read-only


@pytest.mark.parametrize(
    ("steps", "block_size", "commit", "method"),
    [
        (21, 8, 16, "recurrent"),
        (21, 8, 0, "recurrent"),
        (13, 16, 13, "recurrent"),
        (40, 16, 40, "chunk"),
        (40, 16, 32, "chunk"),
    ],
)
def test_gated_delta_net_matches_reference(
    steps: int, block_size: int, commit: int, method: str, poisoned_allocations: None
) -> None:
    """Bidirectional layer core, q/k given unnormalised as strided views of one conv output (as the
    engine holds them), the committed state after ``commit`` tokens."""
    key_heads, value_heads, head_k, head_v = 1, 2, 12, 10
    t = delta_inputs(steps, key_heads, value_heads, head_k, head_v, decay=1.0, seed=steps + commit)
    n = net_inputs(steps, value_heads, head_v, seed=steps)
    key_dim = key_heads * head_k
    mixed = torch.cat(
        [3 * t["q"].reshape(steps, -1), 2 * t["k"].reshape(steps, -1), t["v"].reshape(steps, -1)], 1
    )
    q = mixed[:, :key_dim].view(steps, key_heads, head_k)
    k = mixed[:, key_dim : 2 * key_dim].view(steps, key_heads, head_k)
    v = mixed[:, 2 * key_dim :].view(steps, value_heads, head_v)
    args = (q, k, v, t["g"], t["beta"], t["state"], 0.3, n["z"], n["norm_weight"], 1e-6)
    options = {
        "commit": commit,
        "block_size": block_size,
        "mix_logits": n["mix_logits"],
        "normalize_qk": True,
    }
    before = t["state"].clone()
    out, committed = gdr.gated_delta_net(*args, **options, method=method)
    want_out, want_committed = reference.gated_delta_net(*args, **options)
    # float32 as above, plus the gated norm and the backward branch's mix: one more reduction
    torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-5)
    if commit:
        torch.testing.assert_close(committed, want_committed, rtol=1e-5, atol=1e-5)
    else:
        assert committed is None
    assert torch.equal(t["state"], before)  # exact: read-only


def test_gated_delta_net_forward_only_and_state_in_place(poisoned_allocations: None) -> None:
    """No mix (a checkpoint without the bidirectional tensors), and the commit written straight into
    the committed state tensor."""
    t = delta_inputs(11, 1, 3, 16, 16, decay=0.5, seed=4)
    n = net_inputs(11, 3, 16, seed=4)
    args = (t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"], 0.25, n["z"], n["norm_weight"], 1e-6)
    want_out, want_state = reference.gated_delta_net(*args, commit=11)
    out, committed = gdr.gated_delta_net(*args, commit=11, state_out=t["state"])
    assert committed is t["state"]
    torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-5)  # float32, as above
    torch.testing.assert_close(t["state"], want_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("steps", [9, 70])  # the step-by-step kernel; the chunked one (3 chunks)
def test_gated_delta_net_half_inputs(steps: int, poisoned_allocations: None) -> None:
    """Half-precision inputs: the chunked kernels' matrix products take operands in the model's half
    type on the tensor cores (``PRECISION="fp16"`` here, ``"bf16"`` for Clover's weights), float32
    sums, and keep w and u in it between the kernels, as flash-linear-attention does; the output and
    the committed state stay within half-precision roundings of the float32 reference."""
    assert gdr.chunk_precision(torch.float16) == "fp16" and gdr.chunk_precision(torch.bfloat16) == "bf16"
    assert gdr.chunk_precision(torch.float32) == "ieee"
    t = delta_inputs(steps, 1, 2, 16, 16, decay=0.5, seed=9)
    n = net_inputs(steps, 2, 16, seed=9)
    half = {name: t[name].half() for name in ("q", "k", "v")}
    z = n["z"].half()
    commit = steps - 4
    out, state = gdr.gated_delta_net(
        half["q"], half["k"], half["v"], t["g"], t["beta"].half(), t["state"], 0.25, z, n["norm_weight"], 1e-6,
        block_size=4, mix_logits=n["mix_logits"], commit=commit,
    )  # fmt: skip
    want, want_state = reference.gated_delta_net(
        *(half[name].float() for name in ("q", "k", "v")), t["g"], t["beta"].half().float(), t["state"], 0.25,
        z.float(), n["norm_weight"], 1e-6, block_size=4, mix_logits=n["mix_logits"], commit=commit,
    )  # fmt: skip
    assert out.dtype == torch.float16 and state is not None and state.dtype == torch.float32
    # float16 inputs, operands and output against float32 on the same values: float16 roundings
    # (2**-11 relative) of the products' operands through the scan and the norm
    torch.testing.assert_close(out.float(), want, rtol=5e-3, atol=5e-3)
    # the state is float32 but built from float16-rounded operands over up to 66 steps
    torch.testing.assert_close(state, want_state, rtol=5e-3, atol=5e-3)


def test_gated_delta_net_rejects_bad_arguments() -> None:
    t = delta_inputs(3, 1, 1, 8, 8, decay=0.1, seed=0)
    n = net_inputs(3, 1, 8, seed=0)
    args = (t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"], 0.3, n["z"], n["norm_weight"], 1e-6)
    with pytest.raises(ValueError, match="needs block_size"):
        gdr.gated_delta_net(*args, mix_logits=n["mix_logits"])
    with pytest.raises(ValueError, match="commit must be"):
        gdr.gated_delta_net(*args, commit=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gdn_gates_match_reference(dtype: torch.dtype, poisoned_allocations: None) -> None:
    """The gates from strided views of one projection (as the fused input projection gives them),
    across softplus's linear branch (a + dt_bias above 20) and a large negative range."""
    gen = torch.Generator().manual_seed(11)
    heads = 6
    projection = (torch.randn(9, 3 * heads, generator=gen) * 8).to(dtype).to(DEVICE)
    projection[0, :heads] = 25.0  # softplus(x) = x above 20
    a, b = projection[:, :heads], projection[:, 2 * heads :]
    a_log = torch.randn(heads, generator=gen).to(DEVICE)
    dt_bias = torch.randn(heads, generator=gen).to(dtype).to(DEVICE)
    g, beta = gdr.gdn_gates(a, b, a_log, dt_bias)
    want_g, want_beta = reference.gdn_gates(a, b, a_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    # float32 exp / log against PyTorch's (log1p for softplus): ~1e-6 relative; values down to
    # softplus(-30) ~ 1e-13, where log(1 + exp(x)) and log1p differ absolutely by far less than 1e-6
    torch.testing.assert_close(g, want_g, rtol=1e-5, atol=1e-6)
    # beta: float32 sigmoid rounded to the dtype once, as PyTorch's (float16: one rounding, 2**-11)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(beta, want_beta, rtol=tolerance, atol=tolerance)
