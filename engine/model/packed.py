"""Packed forwards: several requests' forwards, each on its own cache, run as one batch.

``CloverModel.forward_packed(segments)`` lays every segment's tokens one after another and does
the token-wise work (embedding, norms, projections, the MoE, the LM head over the logit rows) once
over all of them, so the experts see every request's tokens in one call. The token mixers keep
each request's state: the Gated DeltaNet layers of segments of one shape run folded into one
call of each operator (``GatedDeltaNet.mix``), attention runs per segment over its own cache.
docs/decoding.md, "Batched forwards".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, cast

import torch

from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.forward import ForwardContext, PackedContext
from clover_agent.engine.ops.transfer import upload

if TYPE_CHECKING:
    from torch import nn

    from clover_agent.engine.model.attention import RotaryEmbedding
    from clover_agent.engine.model.cache import LayerState
    from clover_agent.engine.model.config import CloverConfig
    from clover_agent.engine.model.norms import ZeroCentredRmsNorm
    from clover_agent.engine.ops import Ops


class DecoderLayer(Protocol):
    """What a packed forward needs of a layer (``network.DecoderLayer``; a protocol, so this module
    never imports the network that calls it)."""

    def forward_packed(
        self, x: torch.Tensor, states: Sequence[LayerState], packed: PackedContext
    ) -> torch.Tensor: ...


class CloverModel(Protocol):
    """What a packed forward needs of the model (``network.CloverModel``)."""

    config: CloverConfig
    layers: nn.ModuleList
    embed_tokens: nn.Embedding
    rotary: RotaryEmbedding
    lm_head: nn.Linear
    norm: ZeroCentredRmsNorm

    @property
    def device(self) -> torch.device: ...

    @property
    def ops(self) -> Ops: ...

    def _checked(
        self,
        input_ids: torch.Tensor | list[int],
        cache: ModelCache,
        attention: str,
        commit: bool | int,
        causal_prefix: int,
        logit_rows: int | None,
    ) -> tuple[torch.Tensor, int | None, int, int]: ...


AttentionRule = Literal["block", "causal"]


@dataclass
class Segment:
    """The arguments of one ``CloverModel.forward`` call (same names, same meaning)."""

    input_ids: list[int] | torch.Tensor
    cache: ModelCache
    attention: AttentionRule
    commit: bool | int = False
    causal_prefix: int = 0
    logit_rows: int | None = None


@dataclass(frozen=True)
class _Checked:
    """One segment after the forward's checks."""

    index: int  # position in the caller's list
    ids: torch.Tensor
    cache: ModelCache
    block_from: int | None
    commit: int
    rows: int

    @property
    def steps(self) -> int:
        return self.ids.shape[0]

    def shape(self, bidirectional: bool) -> tuple[int, int, int]:
        """What a Gated DeltaNet layer branches on (its first block-rule row; -1: none, or not a
        bidirectional checkpoint): segments with equal shapes run folded together."""
        block_rows = -1 if self.block_from is None or self.block_from >= self.steps else self.block_from
        return self.steps, self.commit, block_rows if bidirectional else -1


def packed_forward(model: CloverModel, segments: Sequence[Segment]) -> list[torch.Tensor]:
    """``[model.forward(**segment) for segment in segments]`` as one batch (see the module docstring).

    The caches must be distinct objects; each ends as its own forward leaves it. Checks, and their
    ValueErrors, are the forward's, all made before anything runs."""
    if not segments:
        return []
    if len({id(s.cache) for s in segments}) != len(segments):
        raise ValueError("every segment of a packed forward needs its own cache (two share one)")
    checked = [_Checked(i, *_check(model, s)) for i, s in enumerate(segments)]
    bidirectional = model.config.bidirectional_gdn
    order = sorted(checked, key=lambda c: c.shape(bidirectional))  # stable: one shape's segments adjacent
    packed = _context(model, order, bidirectional)
    with torch.no_grad():
        hidden = model.embed_tokens(torch.cat([c.ids for c in order]))
        for index, layer in enumerate(cast("Iterable[DecoderLayer]", model.layers)):
            hidden = layer.forward_packed(hidden, [c.cache.layers[index] for c in order], packed)
        for c in order:
            if c.commit:
                c.cache.advance(c.commit)
        return _logits(model, hidden, order, packed)


def _check(model: CloverModel, segment: Segment) -> tuple[torch.Tensor, ModelCache, int | None, int, int]:
    ids, block_from, commit, rows = model._checked(
        segment.input_ids,
        segment.cache,
        segment.attention,
        segment.commit,
        segment.causal_prefix,
        segment.logit_rows,
    )
    return ids, segment.cache, block_from, commit, rows


def _context(model: CloverModel, order: list[_Checked], bidirectional: bool) -> PackedContext:
    """Every segment's context, with positions and rotary angles computed once for all rows."""
    device = model.device
    offsets = [0]
    starts: list[int] = []
    for c in order:
        starts.append(c.cache.length)
        offsets.append(offsets[-1] + c.steps)
    positions = upload(
        [p for c, start in zip(order, starts, strict=True) for p in range(start, start + c.steps)], device
    )
    cos, sin = model.rotary.cos_sin(positions, model.embed_tokens.weight.dtype)
    contexts = []
    for i, c in enumerate(order):
        at = slice(offsets[i], offsets[i + 1])
        contexts.append(
            ForwardContext(
                ops=model.ops,
                past=c.cache.length,
                steps=c.steps,
                block_size=model.config.block_size,
                block_from=c.block_from,
                commit=c.commit,
                positions=positions[at],
                rotary=(cos[at], sin[at]),
            )
        )
    groups: list[tuple[int, int]] = []
    for i, c in enumerate(order):
        if groups and order[groups[-1][0]].shape(bidirectional) == c.shape(bidirectional):
            groups[-1] = (groups[-1][0], i + 1)
        else:
            groups.append((i, i + 1))
    return PackedContext(ops=model.ops, contexts=contexts, offsets=offsets, groups=groups, rotary=(cos, sin))


def _logits(
    model: CloverModel, hidden: torch.Tensor, order: list[_Checked], packed: PackedContext
) -> list[torch.Tensor]:
    """Each segment's float32 logits over its last ``rows`` rows (the LM head once, over those rows only)."""
    wanted = [
        r for i, c in enumerate(order) for r in range(packed.offsets[i + 1] - c.rows, packed.offsets[i + 1])
    ]
    results: list[torch.Tensor] = [hidden.new_zeros(0)] * len(order)
    vocab = model.config.vocab_size
    if not wanted:
        logits = hidden.new_zeros(0, vocab, dtype=torch.float32)
    else:
        rows = hidden.index_select(0, upload(wanted, hidden.device))
        logits = model.lm_head(model.ops.rms_norm(rows, model.norm.weight, model.norm.eps)).float()
    start = 0
    for c in order:
        results[c.index] = logits[start : start + c.rows]
        start += c.rows
    return results
