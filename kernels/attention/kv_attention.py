"""Launchers of the block-causal attention kernels. The committed length is a device tensor and the
grids depend only on T and the cache capacity, so every call is graph-safe (no host read-back)."""

from __future__ import annotations

import torch
import triton

from clover_agent.kernels.attention import triton_kernels as tk
from clover_agent.kernels.runtime import dot_precision

#: Rows ((token, head) pairs) per program.
BLOCK_M = 64
#: Keys per inner iteration.
BLOCK_N = 32
#: Most key splits, and keys per split below which a split is not worth it.
MAX_SPLITS = 32
KEYS_PER_SPLIT = 512


def splits_for(steps: int, group: int, kv_heads: int, capacity: int) -> int:
    """Key splits for a step: none when the (token, head) tiles already fill the GPU (prefill), else
    enough that long contexts spread over many programs."""
    tiles = kv_heads * triton.cdiv(steps * group, BLOCK_M)
    if tiles >= 64:
        return 1
    return max(1, min(MAX_SPLITS, triton.cdiv(capacity, KEYS_PER_SPLIT)))


def _length(length: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not isinstance(length, torch.Tensor) or length.numel() != 1 or length.dtype.is_floating_point:
        raise ValueError("length must be a one-element integer tensor on the cache's device")
    return length.reshape(1).to(device)


def write_kv(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """Contract of :func:`reference.write_kv`: k_new, v_new [T, Hkv, D] (read-only) written in place
    at rows [length, length + T) of k_cache, v_cache [capacity, Hkv, D]; ``length`` is a one-element
    integer tensor on the device (never read by the host)."""
    steps, kv_heads, head_dim = k_new.shape
    if steps == 0:
        return
    length = _length(length, k_cache.device)
    for t in (k_new, v_new, k_cache, v_cache):
        if t.stride(-1) != 1:
            raise ValueError("K/V tensors must have a unit stride in the head dimension")
    tk.write_kv_kernel[(steps, kv_heads)](
        k_new,
        v_new,
        k_cache,
        v_cache,
        length,
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),
        v_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def block_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
    *,
    block_size: int,
    scale: float,
    gate: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """Contract of :func:`reference.block_attention`, with ``length`` a one-element integer tensor on
    the device: q [T, H, D] and gate [T, H, D] (views with a unit last stride are fine), caches
    [capacity, Hkv, D] holding the step's own K/V at rows [length, length + T) (see
    :func:`write_kv`), all read-only. ``block_size=1`` is causal. Returns a new [T, H, D] tensor in
    q's dtype. ``splits``: key-range splits (default :func:`splits_for`)."""
    steps, heads, head_dim = q.shape
    capacity, kv_heads, _ = k_cache.shape
    if heads % kv_heads or k_cache.shape[2] != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"attention shapes disagree: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
            f"v_cache {tuple(v_cache.shape)}"
        )
    out = torch.empty(steps, heads, head_dim, dtype=q.dtype, device=q.device)
    if steps == 0:
        return out
    length = _length(length, q.device)
    group = heads // kv_heads
    splits = splits or splits_for(steps, group, kv_heads, capacity)
    q = q if q.stride(-1) == 1 else q.contiguous()
    part = torch.empty(splits, steps, heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(splits, steps, heads, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    tiles = triton.cdiv(steps * group, BLOCK_M)
    tk.attention_split_kernel[(kv_heads * tiles, splits)](
        q,
        k_cache,
        v_cache,
        length,
        part,
        lse,
        steps,
        block_size,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        SPLITS=splits,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        PRECISION=dot_precision(q.dtype),
        num_warps=8,  # a [64, 256] float32 accumulator
    )
    if gate is not None and gate.stride(-1) != 1:
        gate = gate.contiguous()
    gate_arg = gate if gate is not None else out
    tk.attention_combine_kernel[(steps * heads,)](
        part,
        lse,
        gate_arg,
        out,
        heads,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        gate_arg.stride(0),
        gate_arg.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        SPLITS=splits,
        HAS_GATE=gate is not None,
        BLOCK_S=max(2, triton.next_power_of_2(splits)),
        BLOCK_D=block_d,
    )
    return out


def attention_step(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
    *,
    block_size: int,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One attention layer step: :func:`write_kv` then :func:`block_attention`. The committed rows
    [0, length) are never written; committing the step is the caller advancing ``length``."""
    write_kv(k_new, v_new, k_cache, v_cache, length)
    return block_attention(q, k_cache, v_cache, length, block_size=block_size, scale=scale, gate=gate)
