"""Plain-PyTorch reference of the GDN short convolution: the causal depthwise conv continuing from the
conv state (``ops.causal_conv1d``), Clover's in-block anti-causal right conv
(``BidirectionalGdn.right_conv``), and the two summed under the SiLU the layer applies."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution continuing from ``state`` (no activation).

    x: [T, C]; weight: [C, K] (tap K-1 multiplies the current row); state: [C, K-1], the K-1
    rows before x (zeros at the start of a sequence), read-only. Returns [T, C] in x's dtype.
    """
    rows = torch.cat([state.to(weight.dtype), x.to(weight.dtype).t()], dim=1)  # [C, K-1+T]
    out = F.conv1d(rows.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0]
    return out.t().to(x.dtype)


def right_conv(rows: torch.Tensor, weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """Anti-causal depthwise conv of pre-conv rows [T, C], zero past each block's end.

    weight: [C, K_r]; tap j (0-based) multiplies row t+1+j. ``rows`` starts on a block boundary;
    its last block may be partial (rows past the end count as zero). Returns [T, C] in rows' dtype.
    """
    steps, channels = rows.shape
    kernel = weight.shape[-1]
    pad = (-steps) % block_size
    blocks = F.pad(rows.to(weight.dtype), (0, 0, 0, pad)).reshape(-1, block_size, channels)
    # [blocks, C, block_size + kernel]: each block followed by `kernel` zero rows, then drop row t itself
    padded = F.pad(blocks.transpose(1, 2), (0, kernel))[..., 1:]
    out = F.conv1d(padded, weight.unsqueeze(1), groups=channels)  # [blocks, C, block_size]
    return out.transpose(1, 2).reshape(-1, channels)[:steps].to(rows.dtype)


def short_conv(
    rows: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    right_weight: torch.Tensor | None = None,
    block_size: int | None = None,
    activation: bool = False,
) -> torch.Tensor:
    """``[silu](causal_conv1d(rows; state) + right_conv(rows))`` as the GDN layer computes it: the right
    conv only with ``right_weight`` [C, K_r] (then ``block_size`` is required), SiLU with
    ``activation``. Read-only inputs; returns [T, C] in rows' dtype."""
    mixed = causal_conv1d(rows, weight, state)
    if right_weight is not None:
        if block_size is None:
            raise ValueError("the right convolution needs block_size")
        mixed = mixed + right_conv(rows, right_weight, block_size)
    return F.silu(mixed) if activation else mixed
