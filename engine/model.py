"""``CloverModel``: the Qwen3.5-MoE / Clover hybrid decoder in plain PyTorch, with explicit caches.

One forward runs T new tokens on top of a :class:`ModelCache` at absolute positions
``cache.length + arange(T)`` and returns float32 logits [T, vocab] (not shifted). Two attention
rules exist:

* ``"causal"``: plain causal attention; GDN layers causal only.
* ``"block"``: block-causal attention (full inside a block of ``config.block_size`` positions
  aligned to 0, causal across blocks); GDN layers causal across the sequence plus, for checkpoints
  with bidirectional tensors, the in-block backward branch.

``commit`` decides what enters the cache: nothing (``False``; the cache stays bit-identical), all T
tokens (``True``) or the first n (``int``, causal mode; a verifier keeps only accepted tokens).

Parameter names follow the checkpoint's with the ``model.`` prefix dropped, so the loader maps
names one to one.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from clover_agent.engine.attention import GatedAttention, RotaryEmbedding
from clover_agent.engine.cache import GdnState, LayerState, ModelCache
from clover_agent.engine.config import CloverConfig
from clover_agent.engine.gdn import GatedDeltaNet
from clover_agent.engine.moe import SparseMoe
from clover_agent.engine.norms import ZeroCentredRmsNorm
from clover_agent.engine.ops import Ops, resolve_ops

AttentionRule = Literal["block", "causal"]


class DecoderLayer(nn.Module):
    """Pre-norm residual block: token mixer (GDN or attention), then the MoE."""

    def __init__(self, config: CloverConfig, layer_type: str) -> None:
        super().__init__()
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        self.mlp = SparseMoe(config)
        self.input_layernorm = ZeroCentredRmsNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRmsNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        state: LayerState,
        ops: Ops,
        *,
        block_size: int | None,
        rotary: tuple[torch.Tensor, torch.Tensor],
        allowed: torch.Tensor,
        commit: int,
    ) -> torch.Tensor:
        normed = ops.rms_norm(x, self.input_layernorm.weight, self.input_layernorm.eps)
        if isinstance(state, GdnState):
            mixed = self.linear_attn(normed, state, ops, block_size=block_size, commit=commit)
        else:
            mixed = self.self_attn(normed, state, ops, rotary=rotary, allowed=allowed, commit=commit)
        x = x + mixed
        normed = ops.rms_norm(x, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        return x + self.mlp(normed, ops)


class CloverModel(nn.Module):
    """Embedding, hybrid decoder layers, final norm and LM head."""

    def __init__(self, config: CloverConfig, kernels: str = "auto") -> None:
        super().__init__()
        self.config = config
        self.ops = resolve_ops(kernels)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind) for kind in config.layer_types)
        self.norm = ZeroCentredRmsNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config)

    def new_cache(self) -> ModelCache:
        """An empty cache on this model's device, K/V and conv state in its dtype."""
        weight = self.embed_tokens.weight
        return ModelCache.empty(self.config, weight.device, weight.dtype)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor | list[int],
        cache: ModelCache,
        *,
        attention: AttentionRule,
        commit: bool | int = False,
    ) -> torch.Tensor:
        """Logits [T, vocab] (float32) for ``input_ids`` [T] (tensor or list) after ``cache``'s tokens."""
        input_ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.embed_tokens.weight.device)
        if input_ids.dim() != 1 or input_ids.numel() == 0:
            raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(input_ids.shape)}")
        if bool(((input_ids < 0) | (input_ids >= self.config.vocab_size)).any()):
            raise ValueError(f"input_ids outside the vocabulary [0, {self.config.vocab_size})")
        steps, past = input_ids.shape[0], cache.length
        commit_count = self._commit_count(commit, steps, attention)
        device = input_ids.device
        positions = torch.arange(past, past + steps, device=device)
        if attention == "block":
            block_size = self.config.block_size
            if past % block_size:
                raise ValueError(
                    f"block attention needs the cache to end on a block boundary: cache.length={past} is not "
                    f"a multiple of block_size={block_size}"
                )
            key_positions = torch.arange(past + steps, device=device)
            allowed = (key_positions[None, :] // block_size) <= (positions[:, None] // block_size)
        else:
            block_size = None
            allowed = torch.arange(past + steps, device=device)[None, :] <= positions[:, None]

        hidden = self.embed_tokens(input_ids)
        rotary = self.rotary.cos_sin(positions, hidden.dtype)
        for layer, state in zip(self.layers, cache.layers, strict=True):
            hidden = layer(
                hidden,
                state,
                self.ops,
                block_size=block_size,
                rotary=rotary,
                allowed=allowed,
                commit=commit_count,
            )
        hidden = self.ops.rms_norm(hidden, self.norm.weight, self.norm.eps)
        logits = self.lm_head(hidden).float()
        if commit_count:
            cache.length += commit_count
            cache.commits += 1
        return logits

    @staticmethod
    def _commit_count(commit: bool | int, steps: int, attention: str) -> int:
        if attention not in ("block", "causal"):
            raise ValueError(f"attention must be 'block' or 'causal', not {attention!r}")
        if isinstance(commit, bool):
            return steps if commit else 0
        if not isinstance(commit, int) or not 0 < commit <= steps:
            raise ValueError(f"commit must be a bool or an int in [1, {steps}], got {commit!r}")
        if commit < steps and attention != "causal":
            raise ValueError("a partial commit (commit=n < T) is only defined for attention='causal'")
        return commit
