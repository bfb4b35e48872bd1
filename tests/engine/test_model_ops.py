"""The PyTorch reference operators against literal loops, on awkward shapes, and the kernel registry."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clover_agent.engine import ops
from clover_agent.engine.errors import EngineArgumentError


def literal_delta_rule(q, k, v, g, beta, state, scale):  # type: ignore[no-untyped-def]
    """Step by step in float64: S = exp(g) S; S += k (beta (v - S^T k))^T; o = scale S^T q."""
    group = v.shape[1] // k.shape[1]
    s = state.double().clone()
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        for h in range(v.shape[1]):
            kt, qt = k[t, h // group].double(), q[t, h // group].double()
            s[h] = torch.exp(g[t, h].double()) * s[h]
            s[h] += torch.outer(kt, beta[t, h].double() * (v[t, h].double() - s[h].t() @ kt))
            out[t, h] = scale * s[h].t() @ qt
    return out, s


@pytest.mark.parametrize(("steps", "heads"), [(1, (1, 1)), (5, (2, 4)), (33, (2, 2)), (70, (1, 3))])
@pytest.mark.parametrize("decay", [0.05, 3.0])
def test_gated_delta_rule_matches_loop(steps: int, heads: tuple[int, int], decay: float) -> None:
    gen = torch.Generator().manual_seed(steps)
    hk, hv = heads
    q = F.normalize(torch.randn(steps, hk, 8, generator=gen), dim=-1)
    k = F.normalize(torch.randn(steps, hk, 8, generator=gen), dim=-1)
    v = torch.randn(steps, hv, 6, generator=gen)
    g = -torch.rand(steps, hv, generator=gen) * decay
    beta = torch.rand(steps, hv, generator=gen)
    state = torch.randn(hv, 8, 6, generator=gen)
    out, final = ops.gated_delta_rule(q, k, v, g, beta, state, 0.3)
    expected_out, expected_final = literal_delta_rule(q, k, v, g, beta, state, 0.3)
    assert out.dtype == final.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_final, rtol=1e-5, atol=1e-5)


def test_causal_conv1d_matches_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    x, weight, state = (
        torch.randn(9, 5, generator=gen),
        torch.randn(5, 4, generator=gen),
        torch.randn(5, 3, generator=gen),
    )
    rows = torch.cat([state.t(), x])  # [3 + 9, C]
    expected = torch.stack([(weight.t() * rows[t : t + 4]).sum(0) for t in range(9)])
    torch.testing.assert_close(ops.causal_conv1d(x, weight, state), expected)


def test_attention_matches_explicit_softmax() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(5, 4, 8, generator=gen),
        torch.randn(7, 2, 8, generator=gen),
        torch.randn(7, 2, 8, generator=gen),
    )
    allowed = torch.rand(5, 7, generator=gen) > 0.4
    allowed[:, 0] = True
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("thd,shd->hts", q, kk) * 0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hts,shd->thd", probs, vv)
    torch.testing.assert_close(ops.attention(q, k, v, allowed, 0.5), expected, rtol=1e-5, atol=1e-6)


def test_moe_experts_matches_per_token_loop() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(11, 6, generator=gen)
    gate_up, down = torch.randn(5, 8, 6, generator=gen), torch.randn(5, 6, 4, generator=gen)
    ids = torch.stack([torch.randperm(5, generator=gen)[:2] for _ in range(11)])
    weights = torch.rand(11, 2, generator=gen)
    expected = torch.zeros_like(x)
    for n in range(11):
        for j in range(2):
            e = int(ids[n, j])
            gate, up = (gate_up[e] @ x[n]).chunk(2)
            expected[n] += weights[n, j] * (down[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(
        ops.moe_experts(x, ids, weights, gate_up, down), expected, rtol=1e-5, atol=1e-5
    )


def test_rms_norms() -> None:
    x, w, gate = torch.randn(3, 8), torch.randn(8), torch.randn(3, 8)
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), x / rms * (1 + w))
    torch.testing.assert_close(ops.gated_rms_norm(x, gate, w, 1e-6), x / rms * w * F.silu(gate))


def test_kernel_choices() -> None:
    assert ops.resolve_ops("auto").backend == "torch"
    assert ops.resolve_ops("torch").gated_delta_rule is ops.gated_delta_rule
    with pytest.raises(EngineArgumentError, match="kernels='triton': no triton implementation"):
        ops.resolve_ops("triton")
    with pytest.raises(EngineArgumentError, match="unknown kernels choice 'cuda'"):
        ops.resolve_ops("cuda")
