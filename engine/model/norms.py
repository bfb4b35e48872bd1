"""Parameter holders of the model's two RMSNorm variants; the arithmetic lives in ``ops``."""

from __future__ import annotations

import torch
from torch import nn


class ZeroCentredRmsNorm(nn.Module):
    """RMSNorm that scales by ``1 + weight`` (weights stored around zero): layer, final and q/k norms."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps


class GatedRmsNorm(nn.Module):
    """The GDN output norm: plain ``weight`` scale, then a SiLU gate."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
