"""Quantised expert weights: FP8 (e4m3, block scales) and INT4 weight-only (w4a16, group scales).

The formats are the ones checkpoints store, so an FP8 checkpoint loads without conversion and the
kernels read the stored bytes: ``dequantize`` here is the reference every kernel is checked
against (docs/quantization.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SCHEMES: tuple[str, ...] = ("fp8", "int4")
#: DeepSeek-V3 / Qwen3 FP8 checkpoints: one float32 scale per 128 x 128 block of each matrix.
FP8_BLOCK = (128, 128)
#: INT4 scales: one per group of this many inputs of one output row.
INT4_GROUP = 128
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
#: Largest magnitude of the symmetric INT4 grid (-8 is representable but never produced).
INT4_MAX = 7
_TINY = torch.finfo(torch.float16).tiny  # a group of zeros still gets a normal, finite scale


def scale_grid(rows: int, cols: int, block: tuple[int, int]) -> tuple[int, int]:
    """Scales of one [rows, cols] matrix under ``block`` (rows, cols per scale): a partial block
    at the end of either dimension has its own scale."""
    return -(-rows // block[0]), -(-cols // block[1])


def quantize_fp8(w: torch.Tensor, block: tuple[int, int] = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] -> (float8_e4m3fn [..., N, K], float32 ``weight_scale_inv`` [..., N/bn, K/bk]).

    Each block's scale is its largest magnitude / 448, so the block's largest element maps to the
    top of the e4m3 range; ``dequantize`` multiplies back (``w ~ fp8 * scale``)."""
    blocks = _blocked(w.float(), block)  # [..., R, bn, C, bk]
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.clamp(amax, min=_TINY) / FP8_MAX
    data = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    return _unblocked(data, w.shape).to(torch.float8_e4m3fn), scale


def quantize_int4(
    w: torch.Tensor, group: int = INT4_GROUP, scale_dtype: torch.dtype = torch.float16
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [..., N, K] -> (uint8 [..., N, ceil(K/2)], ``scale_dtype`` scales [..., N, ceil(K/group)]).

    Symmetric, round to nearest: ``q = round(w / s)`` in [-7, 7] with ``s`` = the group's largest
    magnitude / 7. Stored as ``q + 8`` (0..15), two per byte along K: element 2j in the low nibble,
    2j + 1 in the high one (an odd K is padded with a zero weight)."""
    blocks = _blocked(w.float(), (1, group))
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = (torch.clamp(amax, min=_TINY) / INT4_MAX).to(scale_dtype)
    q = torch.round(blocks / scale.float()[..., :, None, :, None]).clamp(-INT4_MAX, INT4_MAX)
    nibbles = (_unblocked(q, w.shape) + 8).to(torch.uint8)
    if nibbles.shape[-1] % 2:
        nibbles = torch.nn.functional.pad(nibbles, (0, 1), value=8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), scale


def dequantize_fp8(
    data: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype
) -> torch.Tensor:
    """``fp8 * scale`` in float32, rounded once to ``dtype`` (what the kernels feed their dots)."""
    return (data.float() * _expand(scale.float(), data.shape, block)).to(dtype)


def dequantize_int4(
    data: torch.Tensor, scale: torch.Tensor, group: int, cols: int, dtype: torch.dtype
) -> torch.Tensor:
    """``(nibble - 8) * scale`` in float32, rounded once to ``dtype``; ``cols`` is the unpacked K.
    The scales broadcast over their groups (a partial last group padded, then cut): no expanded
    copy of them, several times faster on the CPU than repeating each scale to every column."""
    q = torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2)
    width = -(-cols // group) * group
    q = q[..., :width] if q.shape[-1] >= width else F.pad(q, (0, width - q.shape[-1]))
    grouped = q.float().sub_(8).view(*q.shape[:-1], width // group, group)
    out = grouped.mul_(scale.float().unsqueeze(-1)).view(*q.shape[:-1], width)
    return out[..., :cols].to(dtype)


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantised stack of expert matrices, logically [E, N, K] (``shape``).

    ``data``: float8_e4m3fn [E, N, K] (``fp8``) or uint8 [E, N, ceil(K/2)] (``int4``); ``scale``:
    [E, halves * R, C] with R x C the scale grid of one half's [N / halves, K] matrix under
    ``block`` ((128, 128) for FP8, (1, group) for INT4). ``halves=2`` is the fused ``gate_up_proj``:
    gate and up rows each have their own grid, as ``gate_proj`` and ``up_proj`` do in a checkpoint.
    """

    scheme: str
    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    cols: int
    halves: int = 1

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.data.shape[0], self.data.shape[1], self.cols))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()

    def index_select(self, dim: int, experts: torch.Tensor) -> QuantizedWeight:
        """The same format holding only ``experts`` (dim 0, as ``Tensor.index_select``), in that order."""
        if dim != 0:
            raise ValueError("quantised experts are selected along dim 0 only")
        return QuantizedWeight(
            self.scheme,
            self.data.index_select(0, experts),
            self.scale.index_select(0, experts),
            self.block,
            self.cols,
            self.halves,
        )

    def expert(self, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert ``index``'s [N, K] weights in ``dtype``."""
        one = QuantizedWeight(
            self.scheme,
            self.data[index : index + 1],
            self.scale[index : index + 1],
            self.block,
            self.cols,
            self.halves,
        )
        return one.dequantize(dtype)[0]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The [E, N, K] weights in ``dtype``: the reference the kernels are checked against."""
        data = self.data.chunk(self.halves, dim=1)
        scale = self.scale.chunk(self.halves, dim=1)
        parts = [
            dequantize_fp8(d, s, self.block, dtype)
            if self.scheme == "fp8"
            else dequantize_int4(d, s, self.block[1], self.cols, dtype)
            for d, s in zip(data, scale, strict=True)
        ]
        return torch.cat(parts, dim=1)


def as_dense(w: torch.Tensor | QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """Expert weights as a plain tensor: quantised ones dequantised to ``dtype``, others as they are."""
    return w.dequantize(dtype) if isinstance(w, QuantizedWeight) else w


def quantize(
    w: torch.Tensor,
    scheme: str,
    *,
    halves: int = 1,
    group: int = INT4_GROUP,
    block: tuple[int, int] = FP8_BLOCK,
) -> QuantizedWeight:
    """Quantise [E, N, K] expert weights (``halves=2``: gate rows then up rows, each its own grid)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown expert quantisation {scheme!r} (choose from {', '.join(SCHEMES)})")
    parts = [quantize_one(part, scheme, group=group, block=block) for part in w.chunk(halves, dim=1)]
    fmt = block if scheme == "fp8" else (1, group)
    return QuantizedWeight(
        scheme,
        torch.cat([d for d, _ in parts], dim=1),
        torch.cat([s for _, s in parts], dim=1),
        fmt,
        w.shape[-1],
        halves,
    )


def quantize_one(
    w: torch.Tensor, scheme: str, *, group: int = INT4_GROUP, block: tuple[int, int] = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) of one matrix (or a stack of them) in ``scheme``."""
    return quantize_fp8(w, block) if scheme == "fp8" else quantize_int4(w, group)


def _blocked(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[..., N, K] zero-padded to whole blocks and viewed as [..., R, bn, C, bk]."""
    rows, cols = w.shape[-2:]
    grid_r, grid_c = scale_grid(rows, cols, block)
    padded = torch.nn.functional.pad(w, (0, grid_c * block[1] - cols, 0, grid_r * block[0] - rows))
    return padded.reshape(*w.shape[:-2], grid_r, block[0], grid_c, block[1])


def _unblocked(blocks: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    rows, cols = shape[-2:]
    grid_r, bn, grid_c, bk = blocks.shape[-4:]
    return blocks.reshape(*shape[:-2], grid_r * bn, grid_c * bk)[..., :rows, :cols]


def _expand(scale: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    """Each element's scale: [..., R, C] repeated over its block and cut to ``shape``."""
    full = scale.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., : shape[-2], : shape[-1]]
