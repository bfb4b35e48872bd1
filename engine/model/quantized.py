"""Routed experts kept quantised (FP8 block scales or INT4 group scales, ``kernels/moe/quant.py``):
the layer that holds the stored bytes, and how checkpoint tensors are written into it. The loader
reaches the formats through this module (docs/quantization.md)."""

from __future__ import annotations

import torch
from torch import nn

from clover_agent.engine.model.config import CloverConfig
from clover_agent.kernels.moe.quant import (
    FP8_BLOCK,
    INT4_GROUP,
    SCHEMES,
    QuantizedWeight,
    dequantize_fp8,
    quantize,
    quantize_one,
    scale_grid,
)

__all__ = ["FP8_BLOCK", "INT4_GROUP", "SCHEMES", "QuantizedRoutedExperts", "dequantize_fp8", "scale_grid"]


class QuantizedRoutedExperts(nn.Module):
    """The routed experts' weights quantised (``kernels/moe/quant.py``; docs/quantization.md):
    ``gate_up_proj`` and ``down_proj`` are :class:`QuantizedWeight` views of four buffers, the
    stored bytes (``*_data``) and their scales (``*_scale``). Made empty on ``device``; the loader
    fills them."""

    def __init__(
        self, config: CloverConfig, scheme: str, block: tuple[int, int], *, device: torch.device
    ) -> None:
        super().__init__()
        self.scheme, self.block = scheme, block
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        for name, rows, cols, halves in (("gate_up_proj", inner, hidden, 2), ("down_proj", hidden, inner, 1)):
            packed = cols if scheme == "fp8" else (cols + 1) // 2
            data_dtype = torch.float8_e4m3fn if scheme == "fp8" else torch.uint8
            grid_rows, grid_cols = scale_grid(rows, cols, block)
            scale_dtype = torch.float32 if scheme == "fp8" else torch.float16
            data = torch.empty(experts, halves * rows, packed, dtype=data_dtype, device=device)
            scale = torch.empty(experts, halves * grid_rows, grid_cols, dtype=scale_dtype, device=device)
            self.register_buffer(f"{name}_data", data)
            self.register_buffer(f"{name}_scale", scale)
        self.cols = {"gate_up_proj": hidden, "down_proj": inner}

    def weight(self, name: str) -> QuantizedWeight:
        halves = 2 if name == "gate_up_proj" else 1
        data, scale = getattr(self, f"{name}_data"), getattr(self, f"{name}_scale")
        return QuantizedWeight(self.scheme, data, scale, self.block, self.cols[name], halves)

    @property
    def gate_up_proj(self) -> QuantizedWeight:
        return self.weight("gate_up_proj")

    @property
    def down_proj(self) -> QuantizedWeight:
        return self.weight("down_proj")

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def store(
        self,
        name: str,
        expert: int | None,
        half: int | None,
        tensor: torch.Tensor,
        scale: torch.Tensor | None,
        checkpoint_block: tuple[int, int],
    ) -> None:
        """Write one checkpoint tensor: ``name``'s whole stack (``expert`` None: [E, N, K]), or one
        expert's matrix (``half`` 0 / 1: its gate / up rows). FP8 bytes stored in this layer's own
        format are copied as they are; anything else (dequantised through ``scale`` when given) is
        quantised here."""
        weight = self.weight(name)
        if (
            self.scheme == "fp8"
            and tensor.dtype == torch.float8_e4m3fn
            and scale is not None
            and checkpoint_block == self.block
        ):
            data, scales = tensor, scale
        else:
            dense = (
                tensor.float()
                if scale is None
                else dequantize_fp8(tensor, scale, checkpoint_block, torch.float32)
            )
            group = self.block[1]
            if expert is None and half is None:  # a fused tensor: every expert, both halves
                fused = quantize(dense, self.scheme, halves=weight.halves, group=group, block=self.block)
                data, scales = fused.data, fused.scale
            else:
                data, scales = quantize_one(dense, self.scheme, group=group, block=self.block)
        data_out = weight.data if expert is None else weight.data[expert]
        scale_out = weight.scale if expert is None else weight.scale[expert]
        if half is not None:
            rows, grid = data_out.shape[0] // 2, scale_out.shape[0] // 2
            data_out = data_out[half * rows : (half + 1) * rows]
            scale_out = scale_out[half * grid : (half + 1) * grid]
        data_out.copy_(data)
        scale_out.copy_(scales.to(scale_out.dtype))
