"""Gated DeltaNet token mixer (the ``linear_attention`` layers)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_agent.engine.bidirectional_gdn import BidirectionalGdn
from clover_agent.engine.cache import GdnState
from clover_agent.engine.config import CloverConfig
from clover_agent.engine.forward import ForwardContext
from clover_agent.engine.norms import GatedRmsNorm


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """Projections, causal short conv, delta-rule recurrence, gated norm, output projection.

    With ``bidirectional`` (checkpoints carrying the extra tensors) block-mode forwards add the
    in-block backward branch of :mod:`clover_agent.engine.bidirectional_gdn`.
    """

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        hidden, conv_dim = config.hidden_size, config.conv_dim
        self.in_proj_qkv = nn.Linear(hidden, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, config.linear_value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, config.linear_num_value_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, config.linear_num_value_heads, bias=False)
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, config.linear_conv_kernel_dim, groups=conv_dim, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(config.linear_num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(config.linear_num_value_heads))
        self.norm = GatedRmsNorm(config.linear_value_head_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(config.linear_value_dim, hidden, bias=False)
        self.bidirectional = BidirectionalGdn(config) if config.bidirectional_gdn else None

    def forward(self, x: torch.Tensor, state: GdnState, ctx: ForwardContext) -> torch.Tensor:
        """x: [T, hidden] on top of ``state``; the first ``ctx.commit`` tokens are folded into it.

        Rows from ``ctx.block_rows`` on (whole blocks) get the in-block backward branch of a
        bidirectional checkpoint; only the causal forward branch and conv tail enter the state."""
        cfg, ops = self.config, ctx.ops
        steps, commit = x.shape[0], ctx.commit
        rows = self.in_proj_qkv(x)  # pre-convolution rows [T, conv_dim]
        z = self.in_proj_z(x).reshape(steps, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        beta = self.in_proj_b(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)

        mixed = ops.causal_conv1d(rows, self.conv1d.weight.squeeze(1), state.conv)
        block_rows = ctx.block_rows if self.bidirectional is not None else None
        if block_rows is not None:
            right = self.bidirectional.right_conv(rows[block_rows:], ctx.block_size)
            mixed = (
                torch.cat([mixed[:block_rows], mixed[block_rows:] + right]) if block_rows else mixed + right
            )
        mixed = F.silu(mixed)
        key_dim = cfg.linear_key_dim
        q = l2_normalize(mixed[:, :key_dim].reshape(steps, cfg.linear_num_key_heads, -1))
        k = l2_normalize(mixed[:, key_dim : 2 * key_dim].reshape(steps, cfg.linear_num_key_heads, -1))
        v = mixed[:, 2 * key_dim :].reshape(steps, cfg.linear_num_value_heads, -1)
        scale = cfg.linear_key_head_dim**-0.5

        if 0 < commit < steps:
            # The committed state must be the one after exactly `commit` tokens.
            head, committed_state = ops.gated_delta_rule(
                q[:commit], k[:commit], v[:commit], g[:commit], beta[:commit], state.recurrent, scale
            )
            tail, _ = ops.gated_delta_rule(
                q[commit:], k[commit:], v[commit:], g[commit:], beta[commit:], committed_state, scale
            )
            out = torch.cat([head, tail])
        else:
            out, committed_state = ops.gated_delta_rule(q, k, v, g, beta, state.recurrent, scale)
        if block_rows is not None:
            part = slice(block_rows, None)
            backward = self.bidirectional.backward_scan(
                q[part], k[part], v[part], g[part], beta[part], ctx.block_size, scale, ops
            )
            mixed_out = self.bidirectional.mix(out[part], backward)
            out = torch.cat([out[:block_rows], mixed_out]) if block_rows else mixed_out

        if commit:
            state.recurrent.copy_(committed_state)
            history = torch.cat([state.conv, rows[:commit].t().to(state.conv.dtype)], dim=1)
            state.conv.copy_(history[:, history.shape[1] - state.conv.shape[1] :])

        out = ops.gated_rms_norm(out.to(x.dtype), z, self.norm.weight, self.norm.eps)
        return self.out_proj(out.reshape(steps, -1))
