"""The bidirectional Gated DeltaNet extension inside a block (our reading of Clover's layout).

Layout and forward rule: ../shared/reference/bidirectional-gdn.md. Per GDN layer a checkpoint may
carry ``linear_attn.conv1d_right.weight`` [conv_dim, 1, K_r] (a depthwise anti-causal convolution
over the pre-convolution qkv rows, block-local) and ``linear_attn.bidir_mix_logits`` [num_v_heads, 2]
(per-head softmax weights over the forward and backward branches). In block mode the layer adds the
right convolution to its causal one, runs a block-local right-to-left delta-rule scan from a zero
state beside the usual forward scan, and mixes the two outputs per head. Only the forward branch and
the causal conv tail ever enter the committed state.

This is the one place the extension lives, so another reading of the real Clover code replaces this
module only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clover_agent.engine.config import CloverConfig
from clover_agent.engine.ops import Ops

#: Checkpoint tensor names, relative to ``...layers.N.linear_attn.``.
CHECKPOINT_TENSORS = ("conv1d_right.weight", "bidir_mix_logits")


class BidirectionalGdn(nn.Module):
    """The right convolution and the branch mixing weights of one GDN layer."""

    def __init__(self, config: CloverConfig) -> None:
        super().__init__()
        kernel = config.right_conv_kernel_size
        self.conv1d_right = nn.Conv1d(
            config.conv_dim, config.conv_dim, kernel, groups=config.conv_dim, bias=False
        )
        self.bidir_mix_logits = nn.Parameter(torch.zeros(config.linear_num_value_heads, 2))

    def right_conv(self, rows: torch.Tensor, block_size: int) -> torch.Tensor:
        """Anti-causal depthwise conv of pre-conv rows [T, C], zero past each block's end.

        Tap j (0-based) of ``conv1d_right.weight`` multiplies row t+1+j. ``rows`` must start on a
        block boundary; its last block may be partial (rows past the end count as zero).
        """
        steps, channels = rows.shape
        kernel = self.conv1d_right.weight.shape[-1]
        pad = (-steps) % block_size
        blocks = F.pad(rows.to(self.conv1d_right.weight.dtype), (0, 0, 0, pad)).reshape(
            -1, block_size, channels
        )
        # [blocks, C, block_size + kernel]: each block followed by `kernel` zero rows, then drop row t itself
        padded = F.pad(blocks.transpose(1, 2), (0, kernel))[..., 1:]
        out = F.conv1d(padded, self.conv1d_right.weight, groups=channels)  # [blocks, C, block_size]
        return out.transpose(1, 2).reshape(-1, channels)[:steps].to(rows.dtype)

    def backward_scan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        block_size: int,
        scale: float,
        ops: Ops,
    ) -> torch.Tensor:
        """Right-to-left gated delta rule inside each block from a zero state; float32 [T, Hv, Dv].

        All blocks run as one batch: blocks become extra heads, and the partial last block is padded
        so that after reversal the padding comes first with beta = 0 and k = 0 (state stays zero).
        """
        steps = q.shape[0]
        pad = (-steps) % block_size
        n_blocks = (steps + pad) // block_size

        def as_reversed_heads(t: torch.Tensor) -> torch.Tensor:
            # [T, H, ...] -> [block_size, n_blocks * H, ...], time reversed inside each block
            t = F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) if pad else t
            t = t.reshape(n_blocks, block_size, *t.shape[1:]).flip(1).transpose(0, 1)
            return t.reshape(block_size, -1, *t.shape[3:])

        num_v_heads, head_k, head_v = v.shape[1], k.shape[2], v.shape[2]
        state = torch.zeros(n_blocks * num_v_heads, head_k, head_v, device=q.device, dtype=torch.float32)
        out, _ = ops.gated_delta_rule(
            as_reversed_heads(q),
            as_reversed_heads(k),
            as_reversed_heads(v),
            as_reversed_heads(g),
            as_reversed_heads(beta),
            state,
            scale,
        )
        out = out.reshape(block_size, n_blocks, num_v_heads, head_v).transpose(0, 1).flip(1)
        return out.reshape(-1, num_v_heads, head_v)[:steps]

    def mix(self, forward_out: torch.Tensor, backward_out: torch.Tensor) -> torch.Tensor:
        """Per-head softmax mix of the branches, [T, Hv, Dv] each."""
        weights = torch.softmax(self.bidir_mix_logits.float(), dim=-1)  # [Hv, 2]
        return forward_out * weights[:, 0, None] + backward_out * weights[:, 1, None]
