"""Plain-PyTorch RMS norms of the model (the engine's ``ops.rms_norm`` / ``ops.gated_rms_norm``), and
the Gated DeltaNet output epilogue: the bidirectional branch mix before the gated norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: ``x / rms(x) * (1 + weight)``, computed in float32, returned in x's dtype.

    x: [..., D]; weight: [D]. Read-only; returns a new tensor."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of the first ``cos.shape[-1]`` dims of x [T, H, D] (half-split pairs:
    dim i with dim i + rot/2), the rest passed; cos, sin [T, rot], in x's dtype op by op."""
    dim = cos.shape[-1]
    rotated, passed = x[..., :dim], x[..., dim:]
    first, second = rotated[..., : dim // 2], rotated[..., dim // 2 :]
    turned = torch.cat([-second, first], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([rotated * cos + turned * sin, passed], dim=-1)


def rms_norm_rotary(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """An attention head's q or k norm, then its rotary embedding: ``rotate(rms_norm(x), cos, sin)``
    (the norm rounded to x's dtype first, as the model runs them). x [T, H, D]; weight [D]."""
    return rotate(rms_norm(x, weight, eps), cos, sin)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next zero-centred RMSNorm, as a decoder layer runs them:
    ``(x + delta, rms_norm(x + delta))``, the sum in x's dtype (the norm reads the rounded sum).

    x, delta: [..., D]; weight: [D]. Read-only; returns new tensors."""
    total = x + delta
    return total, rms_norm(total, weight, eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GDN output norm: ``weight * x / rms(x) * silu(gate)`` (plain weight, norm before gate).

    x, gate: [..., D]; weight: [D]. The normalised x is rounded to x's dtype before the gate, as the
    model does. Read-only; returns a new tensor in x's dtype."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(x.dtype)


def mix_branches(
    forward_out: torch.Tensor, backward_out: torch.Tensor, mix_logits: torch.Tensor
) -> torch.Tensor:
    """Per-head softmax mix of the bidirectional GDN branches ([T, Hv, Dv] each; mix_logits [Hv, 2]):
    ``w0 * forward + w1 * backward`` with ``w = softmax(mix_logits[h])``, float32."""
    weights = torch.softmax(mix_logits.float(), dim=-1)
    return forward_out * weights[:, 0, None] + backward_out * weights[:, 1, None]


def gdn_output(
    forward_out: torch.Tensor,
    z: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backward_out: torch.Tensor | None = None,
    mix_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GDN layer after its scans: mix the branches (when ``backward_out`` is given), round to z's
    dtype, gated RMSNorm with gate ``z``. forward_out, backward_out: [T, Hv, Dv] float32; z: [T, Hv, Dv]."""
    if backward_out is None:
        out = forward_out
    else:
        assert mix_logits is not None, "the backward branch needs mix_logits"
        out = mix_branches(forward_out, backward_out, mix_logits)
    return gated_rms_norm(out.to(z.dtype), z, weight, eps)
