"""The bidirectional Gated DeltaNet extension inside a block (our reading of Clover's layout).

Layout and forward rule: docs/bidirectional-gdn.md. This module holds the extension's parameters
(:class:`BidirectionalGdn`: a block-local anti-causal convolution and per-head mixing weights of the
forward and backward branches); the arithmetic is the ``short_conv`` (right taps) and
``gated_delta_net`` (backward scan and mix) operators of :mod:`clover_agent.engine.ops`, whose
PyTorch references are ``clover_agent.kernels.short_conv.reference`` and
``clover_agent.kernels.gated_delta_rule.reference``. Only the forward branch and the causal conv
tail ever enter the committed state.
"""

from __future__ import annotations

import torch
from torch import nn

from clover_agent.engine.model.config import CloverConfig

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
