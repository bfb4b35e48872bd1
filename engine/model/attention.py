"""Gated full attention (the ``full_attention`` layers) and its rotary position embedding."""

from __future__ import annotations

import torch
from torch import nn

from clover_agent.engine.model.cache import AttentionKV
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext
from clover_agent.engine.model.fused import FusedInputs
from clover_agent.engine.model.norms import ZeroCentredRmsNorm


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
        cfg = self.config
        steps = x.shape[0]
        ops = ctx.ops
        q, k, v = self.project(x)
        query, gate = q.reshape(steps, cfg.num_attention_heads, 2 * cfg.head_dim).chunk(2, dim=-1)
        cos, sin = ctx.rotary  # the q / k norms and the rotary embedding: one launch each on the GPU
        query = ops.rms_norm_rotary(query, self.q_norm.weight, self.q_norm.eps, cos, sin)
        key = ops.rms_norm_rotary(
            k.reshape(steps, cfg.num_key_value_heads, -1),
            self.k_norm.weight,
            self.k_norm.eps,
            cos,
            sin,
        )
        value = v.reshape(steps, cfg.num_key_value_heads, -1)

        kv.write(key, value, ctx.positions)
        out = ops.attention(
            query,
            kv.key_buffer,
            kv.value_buffer,
            ctx.past,
            ctx.block_size,
            ctx.block_from,
            cfg.head_dim**-0.5,
            gate,
        )
        return self.o_proj(out.reshape(steps, -1))
