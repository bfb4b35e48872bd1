"""Launchers of the RMS norm kernels. Each takes rows of the last dimension; inputs are read-only and
the result is a new tensor. No host read-back (graph-safe)."""

from __future__ import annotations

import torch
import triton

from clover_agent.kernels.norms import triton_kernels as tk


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, D] with unit stride in D (a view when possible)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (contract of :func:`reference.rms_norm`): x [..., D], weight [D];
    returns ``x / rms(x) * (1 + weight)`` in x's dtype, float32 inside."""
    rows = _rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        tk.rms_norm_kernel[(rows.shape[0],)](
            rows,
            weight,
            out,
            rows.shape[1],
            rows.stride(0),
            out.stride(0),
            eps,
            BLOCK_D=triton.next_power_of_2(rows.shape[1]),
        )
    return out.reshape(x.shape)


def rms_norm_rotary(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """An attention head's q or k norm and its rotary embedding in one launch (contract of
    :func:`reference.rms_norm_rotary`): x [T, H, D] (heads may be a strided view, unit stride in D),
    weight [D], cos / sin [T, rot]; a new [T, H, D] tensor in x's dtype."""
    tokens, heads, size = x.shape
    rot = cos.shape[-1]
    if rot % 2 or rot > size or sin.shape != cos.shape or cos.shape[0] != tokens:
        raise ValueError(
            f"cos / sin must be [T, even rot <= {size}], got {tuple(cos.shape)} / {tuple(sin.shape)}"
        )
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    out = torch.empty(tokens, heads, size, dtype=x.dtype, device=x.device)
    if tokens * heads:
        tk.rms_norm_rotary_kernel[(tokens * heads,)](
            x, weight, cos, sin, out, size, heads, rot, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
            out.stride(0), out.stride(1), eps, BLOCK_D=triton.next_power_of_2(size),
        )  # fmt: skip
    return out


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm in one launch (contract of :func:`reference.add_rms_norm`):
    ``(x + delta, rms_norm(x + delta))``, the sum in x's dtype; x, delta [..., D], weight [D]."""
    if delta.dtype != x.dtype or delta.shape != x.shape:
        raise ValueError(
            f"delta must match x: {tuple(delta.shape)} {delta.dtype} vs {tuple(x.shape)} {x.dtype}"
        )
    rows, deltas = _rows(x), _rows(delta)
    total = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        tk.add_rms_norm_kernel[(rows.shape[0],)](
            rows, deltas, weight, total, out, rows.shape[1], rows.stride(0), deltas.stride(0),
            total.stride(0), out.stride(0), eps, BLOCK_D=triton.next_power_of_2(rows.shape[1]),
        )  # fmt: skip
    return total.reshape(x.shape), out.reshape(x.shape)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm (contract of :func:`reference.gated_rms_norm`): x, gate [..., D], weight [D];
    returns ``weight * x / rms(x) * silu(gate)`` in x's dtype, float32 inside."""
    return _gated(x, None, None, gate, weight, eps, x.dtype)


def gdn_output(
    forward_out: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backward_out: torch.Tensor | None = None,
    mix_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Contract of :func:`reference.gdn_output`: branch mix (when ``backward_out`` is given) and gated
    RMSNorm in one kernel. forward_out, backward_out, z: [T, Hv, Dv]; mix_logits [Hv, 2]; returns
    [T, Hv, Dv] in z's dtype."""
    return _gated(forward_out, backward_out, mix_logits, z, weight, eps, z.dtype)


def _gated(
    x: torch.Tensor,
    x2: torch.Tensor | None,
    mix_logits: torch.Tensor | None,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    rows, gates = _rows(x), _rows(gate)
    second = _rows(x2) if x2 is not None else rows
    mix = mix_logits.contiguous() if mix_logits is not None else weight
    heads = x.shape[-2] if x.dim() > 1 else 1
    out = torch.empty(rows.shape, dtype=dtype, device=x.device)
    if rows.shape[0]:
        tk.gated_norm_kernel[(rows.shape[0],)](
            rows,
            second,
            mix,
            gates,
            weight,
            out,
            rows.shape[1],
            heads,
            rows.stride(0),
            second.stride(0),
            gates.stride(0),
            out.stride(0),
            eps,
            MIX=x2 is not None,
            BLOCK_D=triton.next_power_of_2(rows.shape[1]),
        )
    return out.reshape(x.shape)
