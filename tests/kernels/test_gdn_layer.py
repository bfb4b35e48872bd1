"""The GDN kernels composed into the layer as the engine wires them (short conv with the right taps
and SiLU, then the fused core with q/k normalisation, both branches, mix, gated norm and the commit)
against the engine tests' float64 loop written from the bidirectional-GDN document."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clover_agent.engine.model.cache import GdnState
from clover_agent.engine.model.gdn import GatedDeltaNet
from clover_agent.kernels.gated_delta_rule import gated_delta_net
from clover_agent.kernels.short_conv import short_conv
from tests.engine.checkpoints import relative_error
from tests.engine.test_bidirectional import bidirectional_layer, reference_layer
from tests.kernels.helpers import requires_triton

pytestmark = requires_triton


def kernel_layer(
    layer: GatedDeltaNet, x: torch.Tensor, state: GdnState, block_size: int, method: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's forward in block mode, committing every token, with the Triton kernels."""
    cfg = layer.config
    steps = x.shape[0]
    rows = layer.in_proj_qkv(x)
    z = layer.in_proj_z(x).reshape(steps, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
    beta = layer.in_proj_b(x).sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(layer.in_proj_a(x).float() + layer.dt_bias)
    right = layer.bidirectional.conv1d_right.weight.squeeze(1)
    mixed = short_conv(rows, layer.conv1d.weight.squeeze(1), state.conv, right, block_size, activation=True)
    key_dim = cfg.linear_key_dim
    q = mixed[:, :key_dim].view(steps, cfg.linear_num_key_heads, -1)
    k = mixed[:, key_dim : 2 * key_dim].view(steps, cfg.linear_num_key_heads, -1)
    v = mixed[:, 2 * key_dim :].view(steps, cfg.linear_num_value_heads, -1)
    out, committed = gated_delta_net(
        q, k, v, g, beta, state.recurrent, cfg.linear_key_head_dim**-0.5, z, layer.norm.weight, layer.norm.eps,
        commit=steps, block_size=block_size, mix_logits=layer.bidirectional.bidir_mix_logits,
        normalize_qk=True, method=method,
    )  # fmt: skip
    return layer.out_proj(out.reshape(steps, -1)), committed


@pytest.mark.parametrize(
    ("steps", "block_size", "right_kernel", "method"), [(21, 8, 3, "auto"), (40, 16, 5, "chunk")]
)
def test_kernel_layer_matches_float64_loop_from_the_document(
    steps: int, block_size: int, right_kernel: int, method: str
) -> None:
    layer = bidirectional_layer(block_size, right_kernel, seed=steps)
    cfg = layer.config
    gen = torch.Generator().manual_seed(100 + steps)
    x = torch.randn(steps, cfg.hidden_size, generator=gen)
    state = GdnState(
        recurrent=torch.randn(
            cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, generator=gen
        ),
        conv=torch.randn(cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, generator=gen),
    )
    expected_out, expected_state, _ = reference_layer(layer, x, state, block_size)
    before = [state.recurrent.clone(), state.conv.clone()]
    with torch.no_grad():
        out, committed = kernel_layer(layer, x, state, block_size, method)
    assert relative_error(out, expected_out) <= 1e-5
    assert relative_error(committed, expected_state) <= 1e-5
    assert torch.equal(state.recurrent, before[0]) and torch.equal(state.conv, before[1])  # exact: read-only
