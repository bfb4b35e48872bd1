"""``CloverModel``: the Qwen3.5-MoE / Clover hybrid decoder in plain PyTorch, with explicit caches.

One forward runs T new tokens on top of a :class:`ModelCache` under one of two attention rules
(``"causal"``, ``"block"``) and decides what enters the cache (:meth:`CloverModel.forward`). It
reads no tensor value on the host, so a step of fixed shape is capturable
(``tests/engine/test_host_syncs.py``; docs/decoding.md, "How a forward runs"). Parameter names
follow the checkpoint's with the ``model.`` prefix dropped, so the loader maps names one to one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import torch
from torch import nn

from clover_agent.engine.model.attention import GatedAttention, RotaryEmbedding
from clover_agent.engine.model.cache import AttentionKV, GdnState, LayerState, ModelCache
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext, PackedContext
from clover_agent.engine.model.gdn import GatedDeltaNet
from clover_agent.engine.model.moe import SparseMoe
from clover_agent.engine.model.norms import ZeroCentredRmsNorm
from clover_agent.engine.model.packed import AttentionRule, Segment, packed_forward
from clover_agent.engine.ops import KernelChoice, Ops, check_kernels, resolve_ops
from clover_agent.engine.ops.transfer import upload


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

    def forward(self, x: torch.Tensor, state: LayerState, ctx: ForwardContext) -> torch.Tensor:
        if isinstance(state, GdnState):
            return self._around(x, lambda normed: self.linear_attn(normed, state, ctx), ctx.ops)
        return self._around(x, lambda normed: self.self_attn(normed, state, ctx), ctx.ops)

    def forward_packed(
        self, x: torch.Tensor, states: Sequence[LayerState], packed: PackedContext
    ) -> torch.Tensor:
        """:meth:`forward` of every segment of ``packed``; x: their rows, concatenated."""
        if hasattr(self, "linear_attn"):
            gdn = cast("list[GdnState]", states)
            return self._around(
                x, lambda normed: self.linear_attn.forward_packed(normed, gdn, packed), packed.ops
            )
        kvs = cast("list[AttentionKV]", states)
        return self._around(x, lambda normed: self.self_attn.forward_packed(normed, kvs, packed), packed.ops)

    def _around(
        self, x: torch.Tensor, mixer: Callable[[torch.Tensor], torch.Tensor], ops: Ops
    ) -> torch.Tensor:
        """The norm, ``mixer``, the residual add and norm, the MoE: all but the mixer token by token."""
        normed = ops.rms_norm(x, self.input_layernorm.weight, self.input_layernorm.eps)
        norm = self.post_attention_layernorm
        x, normed = ops.add_rms_norm(x, mixer(normed), norm.weight, norm.eps)  # one launch on the GPU
        return self.mlp(normed, ops, residual=x)


class CloverModel(nn.Module):
    """Embedding, hybrid decoder layers, final norm and LM head.

    ``kernels`` is resolved per operator for the device the weights are on (see ``ops.py``), on
    first use or through :attr:`ops`.
    """

    def __init__(self, config: CloverConfig, kernels: KernelChoice = "auto") -> None:
        super().__init__()
        check_kernels(kernels)
        self.config = config
        self.kernels = kernels
        self._ops: dict[torch.device, Ops] = {}
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind) for kind in config.layer_types)
        self.norm = ZeroCentredRmsNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def experts_on(self) -> str:
        """Where the routed experts are: ``"device"`` (this model's) or ``"host"`` (host memory,
        computed by the CPU; ``SparseMoe.host_forward``). The loader places them (``experts_on=``)."""
        mlps = (cast("DecoderLayer", layer).mlp for layer in self.layers)
        return "host" if any(mlp.experts_on == "host" for mlp in mlps) else "device"

    @property
    def ops(self) -> Ops:
        """The operator table for this model's device (resolved once per device)."""
        device = self.device
        if device not in self._ops:
            self._ops[device] = resolve_ops(self.kernels, device)
        return self._ops[device]

    def fuse_projections(self) -> None:
        """Each layer's input projections as one GEMM (``fused.FusedInputs``: a Gated DeltaNet's
        four, an attention layer's q / k / v); the loader does this once the weights are in."""
        for layer in cast("Iterable[DecoderLayer]", self.layers):
            mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
            mixer.fuse()

    def new_cache(self, capacity: int = 0) -> ModelCache:
        """An empty cache on this model's device, K/V (room for ``capacity`` tokens) and conv state in
        its dtype."""
        weight = self.embed_tokens.weight
        return ModelCache.empty(self.config, weight.device, weight.dtype, capacity)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor | list[int],
        cache: ModelCache,
        *,
        attention: AttentionRule,
        commit: bool | int = False,
        causal_prefix: int = 0,
        logit_rows: int | None = None,
        length: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 logits [n, vocab] for the last n = ``logit_rows`` (None: all T) of ``input_ids`` [T]
        (tensor or list of ids inside the vocabulary) after ``cache``'s tokens.

        ``length``: ``cache.length`` as a 0-d int64 device tensor; positions and attention then read
        the context length from device memory, so a captured CUDA graph replays at any length.

        The T tokens sit at absolute positions ``cache.length + arange(T)``; the logits are not
        shifted. ``attention``:

        * ``"causal"``: plain causal attention; GDN layers causal only.
        * ``"block"``: full attention inside each block of ``config.block_size`` positions aligned to 0,
          causal across blocks; GDN layers causal, plus the in-block backward branch for checkpoints with
          bidirectional tensors. ``causal_prefix=n`` (whole blocks) encodes the first n rows causally
          instead: a causal-context commit fused with the next block's first denoising pass.

        ``commit`` decides what enters the cache: nothing (``False``; the committed state stays
        bit-identical), all T tokens (``True``) or the first n (``int``: under ``"causal"`` any n, as a
        verifier keeps only accepted tokens; under ``"block"`` whole blocks, a commit fused with the next
        block's first pass).

        ``logit_rows=0`` runs no LM head, as in commit and prefill passes, where it would read the whole
        [vocab, hidden] matrix for nothing. Everything the forward branches on is a Python number or a
        shape.
        """
        input_ids, block_from, commit_count, rows = self._checked(
            input_ids, cache, attention, commit, causal_prefix, logit_rows
        )
        steps, past = input_ids.shape[0], cache.length

        if length is None:
            positions = torch.arange(past, past + steps, device=input_ids.device)
        else:
            positions = length + torch.arange(steps, device=input_ids.device)
        hidden = self.embed_tokens(input_ids)
        ctx = ForwardContext(
            ops=self.ops,
            past=past if length is None else length,
            steps=steps,
            block_size=self.config.block_size,
            block_from=block_from,
            commit=commit_count,
            positions=positions,
            rotary=self.rotary.cos_sin(positions, hidden.dtype),
        )
        for layer, state in zip(self.layers, cache.layers, strict=True):
            hidden = layer(hidden, state, ctx)
        if commit_count:
            cache.advance(commit_count)
        if rows == 0:
            return hidden.new_zeros(0, self.config.vocab_size, dtype=torch.float32)
        hidden = self.ops.rms_norm(hidden[steps - rows :], self.norm.weight, self.norm.eps)
        return self.lm_head(hidden).float()

    def forward_packed(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """:meth:`forward` of each segment (each on its own cache), run as one batch: result i is
        segment i's logits and each cache ends as its forward leaves it (``engine/model/packed.py``)."""
        return packed_forward(self, segments)

    def _checked(
        self,
        input_ids: torch.Tensor | list[int],
        cache: ModelCache,
        attention: str,
        commit: bool | int,
        causal_prefix: int,
        logit_rows: int | None,
    ) -> tuple[torch.Tensor, int | None, int, int]:
        """A forward's arguments checked: (input ids on the device, block_from, commit count, logit
        rows); a ValueError names the first bad one."""
        if not isinstance(input_ids, torch.Tensor):
            input_ids = upload(input_ids, self.device)
        input_ids = input_ids.to(self.device, torch.long)
        if input_ids.dim() != 1 or input_ids.numel() == 0:
            raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(input_ids.shape)}")
        steps, past = input_ids.shape[0], cache.length
        block_from = self._block_from(attention, causal_prefix, steps, past)
        commit_count = self._commit_count(commit, steps, attention)
        if causal_prefix and commit_count not in (0, causal_prefix):
            raise ValueError(
                f"with causal_prefix={causal_prefix} (a causal context committed in this pass) commit must "
                f"be all of it or nothing (got commit={commit_count})"
            )
        rows = steps if logit_rows is None else logit_rows
        if not 0 <= rows <= steps:
            raise ValueError(f"logit_rows must be in [0, {steps}] or None, got {logit_rows!r}")
        return input_ids, block_from, commit_count, rows

    def _block_from(self, attention: str, causal_prefix: int, steps: int, past: int) -> int | None:
        if attention not in ("block", "causal"):
            raise ValueError(f"attention must be 'block' or 'causal', not {attention!r}")
        block_size = self.config.block_size
        if attention == "causal":
            if causal_prefix:
                raise ValueError("causal_prefix only applies to attention='block'")
            return None
        if past % block_size:
            raise ValueError(
                f"block attention needs the cache to end on a block boundary: cache.length={past} is not "
                f"a multiple of block_size={block_size}"
            )
        if causal_prefix < 0 or causal_prefix % block_size or causal_prefix > steps:
            raise ValueError(
                f"causal_prefix must be whole blocks of {block_size} within the {steps} tokens, got {causal_prefix}"
            )
        return causal_prefix

    def _commit_count(self, commit: bool | int, steps: int, attention: str) -> int:
        if isinstance(commit, bool):
            return steps if commit else 0
        if not isinstance(commit, int) or not 0 < commit <= steps:
            raise ValueError(f"commit must be a bool or an int in [1, {steps}], got {commit!r}")
        block_size = self.config.block_size
        if commit < steps and attention != "causal" and commit % block_size:
            raise ValueError(
                f"a partial commit (commit={commit} < {steps} tokens) under attention='block' must cover "
                f"whole blocks of {block_size}"
            )
        return commit
