"""``ForwardContext``: what one forward pass tells every layer, built once per pass by the model.

Layers take ``(x, state, ctx)`` and read the per-forward metadata from here instead of each
signature carrying the operator table, the block rule, the rotary angles and the commit count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clover_agent.engine.ops import Ops


@dataclass(frozen=True)
class ForwardContext:
    """Metadata of one forward over ``steps`` tokens after ``past`` committed ones.

    ``block_from``: rows from this index on follow the block rule (full attention inside their
    ``block_size`` block, and the GDN in-block backward branch of a bidirectional checkpoint); the
    rows before it are causal. 0 is block attention, None causal attention. ``commit``: how many
    leading rows enter the committed state (0: none; the state is then only read).
    """

    ops: Ops
    past: int | torch.Tensor  # an int, or a 0-d device tensor (CUDA-graph steps)
    steps: int
    block_size: int
    block_from: int | None
    commit: int
    positions: torch.Tensor  # [steps] absolute positions, on the model's device
    rotary: tuple[torch.Tensor, torch.Tensor]  # cos, sin: [steps, rotary_dim]

    @property
    def block_rows(self) -> int | None:
        """Index of the first block-rule row, or None when no row follows the block rule."""
        if self.block_from is None or self.block_from >= self.steps:
            return None
        return self.block_from


@dataclass(frozen=True)
class PackedContext:
    """Several forwards run as one (``CloverModel.forward_packed``): their tokens laid one segment
    after another, the token-wise work done once over all of them, the token mixers per segment.

    ``contexts[i]``: segment i's own context (in packed order); its tokens are rows
    ``offsets[i]:offsets[i + 1]``. ``groups``: ``(first, end)`` runs of adjacent segments of one
    shape (token count, commit, block rule), whose Gated DeltaNet layers run folded together.
    ``rotary``: every segment's angles, concatenated."""

    ops: Ops
    contexts: list[ForwardContext]
    offsets: list[int]
    groups: list[tuple[int, int]]
    rotary: tuple[torch.Tensor, torch.Tensor]

    def rows(self, first: int, end: int = -1) -> slice:
        """The packed rows of segments ``first`` .. ``end - 1`` (just ``first`` by default)."""
        return slice(self.offsets[first], self.offsets[first + 1 if end < 0 else end])
