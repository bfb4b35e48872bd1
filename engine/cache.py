"""Committed model state for block diffusion: attention K/V per full-attention layer, recurrent and
conv state per Gated DeltaNet layer.

The model reads this state on every forward and writes it only on a commit (see
``CloverModel.forward``), so denoising passes run on top of the committed prefix without
changing a single element. Committing writes in place: the K/V rows past ``length`` and the GDN
state tensors; nothing else ever mutates these tensors.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from clover_agent.engine.config import CloverConfig


@dataclass
class GdnState:
    """State of one Gated DeltaNet layer after the committed tokens.

    recurrent: float32 [num_v_heads, head_k_dim, head_v_dim]; conv: [conv_dim, kernel-1], the last
    pre-convolution rows (zeros before the sequence start).
    """

    recurrent: torch.Tensor
    conv: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [self.recurrent, self.conv]


class AttentionKV:
    """Keys and values of one full-attention layer, in a buffer that grows by doubling.

    ``keys()`` / ``values()`` are views of the committed rows [0, length); rows past ``length``
    are spare capacity.
    """

    def __init__(self, num_kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype) -> None:
        self.key_buffer = torch.zeros(0, num_kv_heads, head_dim, device=device, dtype=dtype)
        self.value_buffer = torch.zeros(0, num_kv_heads, head_dim, device=device, dtype=dtype)
        self.length = 0

    def keys(self) -> torch.Tensor:
        return self.key_buffer[: self.length]

    def values(self) -> torch.Tensor:
        return self.value_buffer[: self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        needed = self.length + keys.shape[0]
        if needed > self.key_buffer.shape[0]:
            capacity = max(needed, 2 * self.key_buffer.shape[0], 64)
            self.key_buffer = self._grown(self.key_buffer, capacity)
            self.value_buffer = self._grown(self.value_buffer, capacity)
        self.key_buffer[self.length : needed] = keys
        self.value_buffer[self.length : needed] = values
        self.length = needed

    def _grown(self, buffer: torch.Tensor, capacity: int) -> torch.Tensor:
        grown = buffer.new_zeros(capacity, *buffer.shape[1:])
        grown[: self.length] = buffer[: self.length]
        return grown

    def tensors(self) -> list[torch.Tensor]:
        return [self.key_buffer, self.value_buffer]


LayerState = GdnState | AttentionKV


class ModelCache:
    """Per-layer committed state plus ``length`` (committed tokens) and ``commits`` (commit passes)."""

    def __init__(self, layers: list[LayerState]) -> None:
        self.layers = layers
        self.length = 0
        self.commits = 0

    @classmethod
    def empty(cls, config: CloverConfig, device: torch.device | str, dtype: torch.dtype) -> ModelCache:
        """State before any token: zero GDN states and empty K/V buffers."""
        device = torch.device(device)
        layers: list[LayerState] = []
        for layer_type in config.layer_types:
            if layer_type == "linear_attention":
                recurrent = torch.zeros(
                    config.linear_num_value_heads,
                    config.linear_key_head_dim,
                    config.linear_value_head_dim,
                    device=device,
                    dtype=torch.float32,
                )
                conv = torch.zeros(
                    config.conv_dim, config.linear_conv_kernel_dim - 1, device=device, dtype=dtype
                )
                layers.append(GdnState(recurrent=recurrent, conv=conv))
            else:
                layers.append(AttentionKV(config.num_key_value_heads, config.head_dim, device, dtype))
        return cls(layers)

    def clone(self) -> ModelCache:
        """An independent deep copy (committing to one never changes the other)."""
        return copy.deepcopy(self)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state, in layer order (for byte counts and equality checks)."""
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        """Bytes held, including the spare K/V capacity."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
