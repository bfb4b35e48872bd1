"""Committed model state for block diffusion: attention K/V per full-attention layer, recurrent and
conv state per Gated DeltaNet layer.

The model reads this state on every forward and changes the committed part only on a commit (see
``CloverModel.forward``), so denoising passes run on top of the committed prefix without changing a
single committed element. K/V live in preallocated buffers: every forward writes its new keys and
values in place into the rows after ``length`` (spare capacity, never read as context), and a
commit only moves ``length`` over the rows it keeps. Nothing is concatenated per pass. GDN states
are overwritten in place on a commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clover_agent.engine.model.config import CloverConfig

#: Smallest K/V capacity a buffer grows to (rows).
MIN_CAPACITY = 64


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

    def buffers(self) -> list[torch.Tensor]:
        return self.tensors()

    def clone(self, capacity: int = 0) -> GdnState:
        return GdnState(self.recurrent.clone(), self.conv.clone())


class AttentionKV:
    """Keys and values of one full-attention layer in preallocated buffers [capacity, Hkv, D].

    Rows [0, length) are committed. A forward over T new tokens writes their K/V into rows
    [length, length + T) (:meth:`write`) and attends over rows [0, length + T) as views; a commit of
    n of them is ``length += n``. The rows past ``length`` are scratch space.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int = 0) -> None:
        self.key_buffer = key_buffer
        self.value_buffer = value_buffer
        self.length = length

    @classmethod
    def empty(
        cls, num_kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype, capacity: int = 0
    ) -> AttentionKV:
        shape = (capacity, num_kv_heads, head_dim)
        return cls(
            torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)
        )

    @property
    def capacity(self) -> int:
        return self.key_buffer.shape[0]

    def keys(self) -> torch.Tensor:
        """Committed keys [length, Hkv, D] (a view)."""
        return self.key_buffer[: self.length]

    def values(self) -> torch.Tensor:
        return self.value_buffer[: self.length]

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total: at least doubles when it grows (one copy of the
        committed rows), so a decoder that reserves a call's length up front never copies again."""
        if rows <= self.capacity:
            return
        capacity = max(rows, 2 * self.capacity, MIN_CAPACITY)
        self.key_buffer = self._copied(self.key_buffer, capacity)
        self.value_buffer = self._copied(self.value_buffer, capacity)

    def write(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Put the K/V of the T tokens after the committed ones (``positions`` = length .. length+T-1,
        a device tensor) into their rows, in place; the offsets stay on the device."""
        self.reserve(self.length + keys.shape[0])
        self.key_buffer.index_copy_(0, positions, keys.to(self.key_buffer.dtype))
        self.value_buffer.index_copy_(0, positions, values.to(self.value_buffer.dtype))

    def _copied(self, buffer: torch.Tensor, capacity: int) -> torch.Tensor:
        grown = buffer.new_zeros(capacity, *buffer.shape[1:])
        grown[: self.length] = buffer[: self.length]
        return grown

    def tensors(self) -> list[torch.Tensor]:
        """The committed rows (views): what equality checks compare."""
        return [self.keys(), self.values()]

    def buffers(self) -> list[torch.Tensor]:
        """The whole buffers, spare capacity included: what byte counts count."""
        return [self.key_buffer, self.value_buffer]

    def clone(self, capacity: int = 0) -> AttentionKV:
        """A copy of the committed rows in buffers of ``max(length, capacity)`` rows."""
        rows = max(self.length, capacity)
        return AttentionKV(
            self._copied(self.key_buffer, rows), self._copied(self.value_buffer, rows), self.length
        )


LayerState = GdnState | AttentionKV


class ModelCache:
    """Per-layer committed state plus ``length`` (committed tokens) and ``commits`` (commit passes)."""

    def __init__(self, layers: list[LayerState]) -> None:
        self.layers = layers
        self.length = 0
        self.commits = 0

    @classmethod
    def empty(
        cls, config: CloverConfig, device: torch.device | str, dtype: torch.dtype, capacity: int = 0
    ) -> ModelCache:
        """State before any token: zero GDN states and K/V buffers of ``capacity`` rows."""
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
                layers.append(
                    AttentionKV.empty(config.num_key_value_heads, config.head_dim, device, dtype, capacity)
                )
        return cls(layers)

    def advance(self, tokens: int) -> None:
        """Record a commit of ``tokens`` tokens (their state is already written in place)."""
        self.length += tokens
        self.commits += 1
        for layer in self.layers:
            if isinstance(layer, AttentionKV):
                layer.length = self.length

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` tokens of K/V in every attention layer (see :meth:`AttentionKV.reserve`)."""
        for layer in self.layers:
            if isinstance(layer, AttentionKV):
                layer.reserve(rows)

    @property
    def capacity(self) -> int:
        """Tokens of K/V room in every attention layer (unbounded without one)."""
        return min(
            (layer.capacity for layer in self.layers if isinstance(layer, AttentionKV)), default=1 << 62
        )

    def load(self, other: ModelCache | None) -> None:
        """Become a copy of ``other``'s committed state (None: the empty state) in this cache's own
        buffers, which must have room for it: what a CUDA graph captured on them reads. Spare rows
        are not copied."""
        if other is None:
            for layer in self.layers:
                if isinstance(layer, GdnState):
                    layer.recurrent.zero_()
                    layer.conv.zero_()
                else:
                    layer.length = 0
            self.length = self.commits = 0
            return
        if other.length > self.capacity:
            raise ValueError(f"a state of {other.length} tokens does not fit a cache of {self.capacity}")
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            if isinstance(mine, GdnState) and isinstance(theirs, GdnState):
                mine.recurrent.copy_(theirs.recurrent)
                mine.conv.copy_(theirs.conv)
            elif isinstance(mine, AttentionKV) and isinstance(theirs, AttentionKV):
                mine.key_buffer[: theirs.length].copy_(theirs.keys())
                mine.value_buffer[: theirs.length].copy_(theirs.values())
                mine.length = theirs.length
            else:
                raise ValueError("the two caches have different layer types")
        self.length, self.commits = other.length, other.commits

    def clone(self, capacity: int = 0) -> ModelCache:
        """An independent copy of the committed state (committing to one never changes the other),
        with K/V room for ``capacity`` tokens; spare rows are not copied."""
        copy = ModelCache([layer.clone(capacity) for layer in self.layers])
        copy.length, copy.commits = self.length, self.commits
        return copy

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the committed state, in layer order (for equality checks)."""
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        """Bytes held, including the spare K/V capacity."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.buffers())
