"""Several input projections of one layer as one GEMM (the Gated DeltaNet's four, the attention's
q / k / v): the input is read once, one launch instead of three or four."""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn


class FusedInputs(nn.Module):
    """A layer whose input projections (:meth:`input_projections`, all ``nn.Linear`` without bias
    over the same input) can run as one GEMM once :meth:`fuse` ran.

    The weights are copied into one matrix and each parameter becomes a view of its rows, so memory
    does not grow and the checkpoint's names, ``state_dict`` and in-place copies into the parameters
    keep working; moving the module (``to``, ``half``) fuses again."""

    #: The projections' weights as one matrix once :meth:`fuse` ran (not a parameter).
    _fused: torch.Tensor | None = None

    def input_projections(self) -> tuple[nn.Linear, ...]:
        raise NotImplementedError

    def fuse(self) -> None:
        parts = self.input_projections()
        with torch.no_grad():
            fused = torch.cat([p.weight.detach() for p in parts])
            offset = 0
            for part in parts:
                rows = part.weight.shape[0]
                part.weight = nn.Parameter(fused[offset : offset + rows], requires_grad=False)
                offset += rows
        self._fused = fused

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Self:
        moved = super()._apply(fn, recurse)
        if self._fused is not None:  # the parameters are new tensors now, no longer its views
            self.fuse()
        return moved

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each projection of ``x``, in :meth:`input_projections`' order: one GEMM once fused."""
        parts = self.input_projections()
        if self._fused is None:
            return tuple(part(x) for part in parts)
        return F.linear(x, self._fused).split([part.out_features for part in parts], dim=-1)
