"""Gated DeltaNet token mixer (the ``linear_attention`` layers)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn

from clover_agent.engine.model.bidirectional_gdn import BidirectionalGdn
from clover_agent.engine.model.cache import GdnState
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext, PackedContext
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
        rows, z, b, a = self.project(x)  # rows: pre-convolution [T, conv_dim]
        g, beta = ctx.ops.gdn_gates(a, b, self.A_log, self.dt_bias)
        return self.out_proj(self.mix(rows, z, g, beta, [state], ctx))

    def forward_packed(
        self, x: torch.Tensor, states: Sequence[GdnState], packed: PackedContext
    ) -> torch.Tensor:
        """:meth:`forward` of every segment of ``packed`` (x: their rows, concatenated): projections
        and gates over all rows at once, :meth:`mix` once per group of segments of one shape."""
        rows, z, b, a = self.project(x)
        g, beta = packed.ops.gdn_gates(a, b, self.A_log, self.dt_bias)
        pieces = []
        for first, end in packed.groups:
            at = packed.rows(first, end)
            pieces.append(
                self.mix(rows[at], z[at], g[at], beta[at], states[first:end], packed.contexts[first])
            )
        return self.out_proj(pieces[0] if len(pieces) == 1 else torch.cat(pieces))

    def mix(
        self,
        rows: torch.Tensor,
        z: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        states: Sequence[GdnState],
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """The layer between its input and output projections for B = ``len(states)`` sequences of
        ``ctx.steps`` tokens each, laid one after another: rows [B*T, conv_dim], z [B*T, value_dim],
        g and beta [B*T, Hv]; returns [B*T, value_dim]; each state takes its commit.

        The short conv, the gates' use, the delta rule and the gated norm are independent per channel
        and per head, so the B sequences are folded into those dimensions (conv channels and value
        heads B times over, the weights repeated, the states stacked) and run as one call of each
        operator: one sequence is B = 1, where every fold is a view."""
        cfg = self.config
        count, steps, commit = len(states), ctx.steps, ctx.commit
        heads, channels = cfg.linear_num_value_heads, cfg.conv_dim
        rows = _fold(rows, count, steps)  # [T, B*C]
        z = _fold(z, count, steps).reshape(steps, count * heads, cfg.linear_value_head_dim)
        g, beta = _fold(g, count, steps), _fold(beta, count, steps)
        conv = _stacked([s.conv for s in states])  # [B*C, K-1]
        recurrent = _stacked([s.recurrent for s in states])  # [B*Hv, Dk, Dv]
        block_rows = ctx.block_rows if self.bidirectional is not None else None
        core = functools.partial(self._core, count=count, ctx=ctx)

        committed: torch.Tensor | None
        if block_rows:  # causal rows [0, block_rows), then block rows: two passes, the state between
            head, committed = core(
                rows[:block_rows], z[:block_rows], g[:block_rows], beta[:block_rows], conv, recurrent,
                commit=block_rows, bidirectional=False,
            )  # fmt: skip
            assert committed is not None  # commit > 0: the state after the causal rows
            history = rows[block_rows - conv.shape[1] : block_rows].t().to(conv.dtype)
            tail, _ = core(
                rows[block_rows:], z[block_rows:], g[block_rows:], beta[block_rows:], history, committed,
                commit=0, bidirectional=True,
            )  # fmt: skip
            out = torch.cat([head, tail])
        else:
            out, committed = core(
                rows, z, g, beta, conv, recurrent, commit=commit, bidirectional=block_rows == 0
            )  # fmt: skip

        if commit:
            assert committed is not None  # commit > 0: the core returned the state
            history = torch.cat([conv, rows[:commit].t().to(conv.dtype)], dim=1)
            history = history[:, history.shape[1] - conv.shape[1] :]
            committed = committed.reshape(count, heads, *committed.shape[1:])
            for i, state in enumerate(states):
                state.recurrent.copy_(committed[i])
                state.conv.copy_(history[i * channels : (i + 1) * channels])
        return _unfold(out.reshape(steps, -1), count)

    def _core(
        self,
        rows: torch.Tensor,
        z: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        conv_state: torch.Tensor,
        recurrent: torch.Tensor,
        *,
        count: int,
        ctx: ForwardContext,
        commit: int,
        bidirectional: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Short conv, then the GDN core (``ops.gated_delta_net``) on ``count`` folded sequences:
        (normed output, state after ``commit`` tokens or None)."""
        cfg, ops = self.config, ctx.ops
        steps = rows.shape[0]
        branch = None
        if bidirectional:
            assert self.bidirectional is not None  # only a bidirectional checkpoint runs the branch
            branch = self.bidirectional
        right = _tiled(branch.conv1d_right.weight.squeeze(1), count) if branch is not None else None
        weight = _tiled(self.conv1d.weight.squeeze(1), count)
        mixed = ops.short_conv(rows, weight, conv_state, right, ctx.block_size, True)
        mixed = mixed.reshape(steps, count, cfg.conv_dim)
        key_dim = cfg.linear_key_dim
        q = mixed[..., :key_dim].reshape(steps, count * cfg.linear_num_key_heads, -1)
        k = mixed[..., key_dim : 2 * key_dim].reshape(steps, count * cfg.linear_num_key_heads, -1)
        v = mixed[..., 2 * key_dim :].reshape(steps, count * cfg.linear_num_value_heads, -1)
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
            mix_logits=_tiled(branch.bidir_mix_logits, count) if branch is not None else None,
            normalize_qk=True,
        )


def _fold(t: torch.Tensor, count: int, steps: int) -> torch.Tensor:
    """[B*T, C] (B sequences one after another) -> [T, B*C] (the sequences side by side)."""
    if count == 1:
        return t
    return t.view(count, steps, -1).transpose(0, 1).reshape(steps, -1)


def _unfold(t: torch.Tensor, count: int) -> torch.Tensor:
    """[T, B*C] -> [B*T, C]: the inverse of :func:`_fold`."""
    if count == 1:
        return t
    steps = t.shape[0]
    return t.view(steps, count, -1).transpose(0, 1).reshape(count * steps, -1)


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-sequence states [X, ...] as one [B*X, ...] (the tensor itself for one sequence)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _tiled(weight: torch.Tensor, count: int) -> torch.Tensor:
    """A per-channel or per-head weight [X, ...] repeated for B folded sequences: [B*X, ...]."""
    return weight if count == 1 else weight.repeat(count, *([1] * (weight.dim() - 1)))
