"""Plain-PyTorch reference of Clover's gated full attention over a preallocated K/V cache.

The cache holds ``capacity`` rows per layer; rows [0, length) are committed. A step with T new
tokens writes their K/V at rows [length, length + T) (beyond the committed length, so committed
state never changes: a later step simply overwrites them), then every query attends to rows
[0, length + T) under the block-causal rule: query i (absolute position length + i) sees key j
when ``j // block_size <= (length + i) // block_size``. ``block_size=1`` is plain causal attention.
Clover's output gate multiplies the result by ``sigmoid(gate)``.

Shapes: T new tokens, H query heads, Hkv key/value heads (H a multiple of Hkv), D head size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention with grouped K/V heads under an explicit mask (``ops.attention``).

    q: [T, H, D]; k, v: [S, Hkv, D]; allowed: [T, S] bool (True = may attend). Returns [T, H, D].
    """
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


def visible(length: int, steps: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The block-causal mask [T, length + T] of a step of ``steps`` queries after ``length`` rows."""
    positions = torch.arange(length, length + steps, device=device)
    keys = torch.arange(length + steps, device=device)
    return (keys[None, :] // block_size) <= (positions[:, None] // block_size)


def write_kv(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int | torch.Tensor,
) -> None:
    """Write the step's keys and values [T, Hkv, D] at rows [length, length + T) of the caches
    [capacity, Hkv, D], in place."""
    start = int(length)
    k_cache[start : start + k_new.shape[0]] = k_new
    v_cache[start : start + v_new.shape[0]] = v_new


def block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: int | torch.Tensor,
    *,
    block_size: int,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the step's queries q [T, H, D] over cache rows [0, length + T) (the step's own
    K/V already written by :func:`write_kv`) under the block-causal rule, times ``sigmoid(gate)``
    (gate [T, H, D]) when given. Reads ``length`` back to the host (the CPU path). Returns [T, H, D]
    in q's dtype."""
    start = int(length)
    steps = q.shape[0]
    keys, values = k_cache[: start + steps], v_cache[: start + steps]
    out = attention(q, keys, values, visible(start, steps, block_size, q.device), scale)
    if gate is not None:
        out = out * torch.sigmoid(gate)
    return out
