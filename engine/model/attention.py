"""Gated full attention (the ``full_attention`` layers) and its rotary position embedding."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from clover_agent.engine.model.cache import AttentionKV
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext, PackedContext
from clover_agent.engine.model.fused import FusedInputs
from clover_agent.engine.model.norms import ZeroCentredRmsNorm
from clover_agent.engine.ops import Ops


class RotaryEmbedding:
    """Rotary angles for absolute positions over the first ``rotary_dim`` dims of each head.

    The checkpoint's multimodal rope sections all see the same position for text, which makes them
    the plain rotary embedding used here.
    """

    def __init__(self, config: CloverConfig) -> None:
        dim = config.rotary_dim
        self.inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
        )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, rotary_dim] (each frequency twice: first half, second half)."""
        if self.inv_freq.device != positions.device:  # moved once, not copied on every forward
            self.inv_freq = self.inv_freq.to(positions.device)
        angles = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


class GatedAttention(FusedInputs):
    """GQA attention with per-head q/k RMSNorm, partial rotary and a sigmoid output gate.

    ``q_proj`` yields, per head, the query then the gate (``2 * head_dim`` rows per head); q, k and
    v run as one GEMM once fused (:class:`FusedInputs`, as the loader leaves a model).
    """

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        self.config = config
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim * 2, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)
        self.q_norm = ZeroCentredRmsNorm(head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCentredRmsNorm(head_dim, config.rms_norm_eps)

    def input_projections(self) -> tuple[nn.Linear, ...]:
        return self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, kv: AttentionKV, ctx: ForwardContext) -> torch.Tensor:
        """x: [T, hidden] after ``ctx.past`` committed tokens. The new K/V go into the cache's rows
        after the committed ones, in place; attention reads the cache there (nothing concatenated)."""
        return self.o_proj(self.attend(*self.heads(x, ctx.rotary, ctx.ops), kv, ctx))

    def forward_packed(
        self, x: torch.Tensor, states: Sequence[AttentionKV], packed: PackedContext
    ) -> torch.Tensor:
        """:meth:`forward` of every segment of ``packed`` (x: their rows, concatenated): projections,
        norms and rotary over all rows at once, then each segment's attention over its own cache."""
        query, gate, key, value = self.heads(x, packed.rotary, packed.ops)
        pieces = []
        for i, (kv, ctx) in enumerate(zip(states, packed.contexts, strict=True)):
            at = packed.rows(i)
            pieces.append(self.attend(query[at], gate[at], key[at], value[at], kv, ctx))
        return self.o_proj(pieces[0] if len(pieces) == 1 else torch.cat(pieces))

    def heads(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], ops: Ops
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token work, (query, gate) [T, H, D] and (key, value) [T, Hkv, D]: the projections, the
        q / k norms and the rotary embedding (one launch each on the GPU) at angles ``rotary``."""
        cfg = self.config
        steps = x.shape[0]
        q, k, v = self.project(x)
        query, gate = q.reshape(steps, cfg.num_attention_heads, 2 * cfg.head_dim).chunk(2, dim=-1)
        cos, sin = rotary
        query = ops.rms_norm_rotary(query, self.q_norm.weight, self.q_norm.eps, cos, sin)
        key = ops.rms_norm_rotary(
            k.reshape(steps, cfg.num_key_value_heads, -1),
            self.k_norm.weight,
            self.k_norm.eps,
            cos,
            sin,
        )
        return query, gate, key, v.reshape(steps, cfg.num_key_value_heads, -1)

    def attend(
        self,
        query: torch.Tensor,
        gate: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv: AttentionKV,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """One sequence's new K/V into its cache, then its gated attention over it: [T, H*D]."""
        kv.write(key, value, ctx.positions)
        out = ctx.ops.attention(
            query,
            kv.key_buffer,
            kv.value_buffer,
            ctx.past,
            ctx.block_size,
            ctx.block_from,
            self.config.head_dim**-0.5,
            gate,
        )
        return out.reshape(query.shape[0], -1)
