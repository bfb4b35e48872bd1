"""Gated DeltaNet token mixer (the ``linear_attention`` layers)."""

from __future__ import annotations

import torch
from torch import nn

from clover_agent.engine.model.bidirectional_gdn import BidirectionalGdn
from clover_agent.engine.model.cache import GdnState
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext
from clover_agent.engine.model.fused import FusedInputs
from clover_agent.engine.model.norms import GatedRmsNorm


class GatedDeltaNet(FusedInputs):
    """Projections, causal short conv, delta-rule recurrence, gated norm, output projection.

    With ``bidirectional`` (checkpoints carrying the extra tensors) block-mode forwards add the
    in-block backward branch of :mod:`clover_agent.engine.model.bidirectional_gdn`.
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

    def input_projections(self) -> tuple[nn.Linear, ...]:
        """(pre-convolution rows, z, b, a), one GEMM once fused (:class:`FusedInputs`)."""
        return self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a

    def forward(self, x: torch.Tensor, state: GdnState, ctx: ForwardContext) -> torch.Tensor:
        """x: [T, hidden] on top of ``state``; the first ``ctx.commit`` tokens are folded into it.

        Rows from ``ctx.block_rows`` on (whole blocks) get Clover's block-local right conv and
        in-block backward branch (bidirectional checkpoints); rows before them (a causally encoded
        context, committed in the same pass or not at all) are causal.
        Only the causal forward branch and the conv tail enter the state."""
        cfg = self.config
        steps, commit = x.shape[0], ctx.commit
        rows, z, b, a = self.project(x)  # rows: pre-convolution [T, conv_dim]
        z = z.reshape(steps, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        g, beta = ctx.ops.gdn_gates(a, b, self.A_log, self.dt_bias)
        block_rows = ctx.block_rows if self.bidirectional is not None else None

        committed: torch.Tensor | None
        if block_rows:  # causal rows [0, block_rows), then block rows: two passes, the state between
            head = self._core(
                rows[:block_rows],
                z[:block_rows],
                g[:block_rows],
                beta[:block_rows],
                state.conv,
                state.recurrent,
                ctx,
                commit=block_rows,
                bidirectional=False,
            )
            assert head[1] is not None  # commit > 0: the state after the causal rows
            history = rows[block_rows - state.conv.shape[1] : block_rows].t().to(state.conv.dtype)
            tail = self._core(
                rows[block_rows:],
                z[block_rows:],
                g[block_rows:],
                beta[block_rows:],
                history,
                head[1],
                ctx,
                commit=0,
                bidirectional=True,
            )
            out, committed = torch.cat([head[0], tail[0]]), head[1]
        else:
            out, committed = self._core(
                rows, z, g, beta, state.conv, state.recurrent, ctx, commit=commit, bidirectional=block_rows == 0
            )  # fmt: skip

        if commit:
            assert committed is not None  # commit > 0: the core returned the state
            state.recurrent.copy_(committed)
            history = torch.cat([state.conv, rows[:commit].t().to(state.conv.dtype)], dim=1)
            state.conv.copy_(history[:, history.shape[1] - state.conv.shape[1] :])
        return self.out_proj(out.reshape(steps, -1))

    def _core(
        self,
        rows: torch.Tensor,
        z: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        conv_state: torch.Tensor,
        recurrent: torch.Tensor,
        ctx: ForwardContext,
        *,
        commit: int,
        bidirectional: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Short conv, then the GDN core (``ops.gated_delta_net``): (normed output, state after
        ``commit`` tokens or None)."""
        cfg, ops = self.config, ctx.ops
        steps = rows.shape[0]
        branch = None
        if bidirectional:
            assert self.bidirectional is not None  # only a bidirectional checkpoint runs the branch
            branch = self.bidirectional
        right = branch.conv1d_right.weight.squeeze(1) if branch is not None else None
        mixed = ops.short_conv(rows, self.conv1d.weight.squeeze(1), conv_state, right, ctx.block_size, True)
        key_dim = cfg.linear_key_dim
        q = mixed[:, :key_dim].reshape(steps, cfg.linear_num_key_heads, -1)
        k = mixed[:, key_dim : 2 * key_dim].reshape(steps, cfg.linear_num_key_heads, -1)
        v = mixed[:, 2 * key_dim :].reshape(steps, cfg.linear_num_value_heads, -1)
        return ops.gated_delta_net(
            q,
            k,
            v,
            g,
            beta,
            recurrent,
            cfg.linear_key_head_dim**-0.5,
            z,
            self.norm.weight,
            self.norm.eps,
            commit=commit,
            block_size=ctx.block_size if bidirectional else None,
            mix_logits=branch.bidir_mix_logits if branch is not None else None,
            normalize_qk=True,
        )
