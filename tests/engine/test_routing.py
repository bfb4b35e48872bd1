"""The router's softmax runs in float32 when the model runs in bf16: in bf16, near-equal
probabilities of a wide router round together and the top-k picks other experts."""

from __future__ import annotations

import torch

from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.moe import SparseMoe
from clover_agent.engine.ops import resolve_ops
from clover_agent.engine.ops.torch_ops import routed_experts
from clover_agent.kernels.moe.reference import route
from tests.engine.checkpoints import tiny_text_config


def bf16_moe() -> SparseMoe:
    """A bf16 MoE with 128 experts top-8 (the full model has 256): many near-equal router outputs."""
    fields = {**tiny_text_config(num_experts=128, num_experts_per_tok=8), "model_type": "qwen3_5_moe_text"}
    config = CloverConfig.from_dict(fields)
    moe = SparseMoe(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return moe.to(torch.bfloat16)


def test_routing_in_float32_differs_from_routing_in_bf16_and_the_module_uses_float32() -> None:
    moe = bf16_moe()
    # Router logits with a spread of ~0.16: 128 near-equal probabilities per token.
    x = torch.randn(64, moe.gate.in_features, generator=torch.Generator().manual_seed(1)) * 0.1
    x = x.to(torch.bfloat16)
    with torch.no_grad():
        logits = moe.gate(x)
    assert logits.dtype == torch.bfloat16
    ids, weights = route(logits, 8)
    expected = torch.topk(torch.softmax(logits.float(), dim=-1), 8, dim=-1).indices
    in_bf16 = torch.topk(torch.softmax(logits, dim=-1), 8, dim=-1).indices  # what bf16 arithmetic picks
    # exact: expert ids. At the top-8 boundary distinct probabilities lie >= 1e-3 apart (thousands of
    # float32 ulps) and tied ones come from equal bf16 logits: any softmax keeps the order.
    assert torch.equal(ids, expected) and weights.dtype == torch.bfloat16
    differ = (torch.sort(expected).values != torch.sort(in_bf16).values).any(dim=-1)  # exact: ids
    assert differ.any(), "this router must be one where bf16 routing picks other experts"

    # The module's output is the experts' combination under the float32 routing.
    ops = resolve_ops("torch")
    with torch.no_grad():
        out = moe(x, ops)
        shared = torch.sigmoid(moe.shared_expert_gate(x)) * moe.shared_expert(x)
        experts = moe.experts.gate_up_proj, moe.experts.down_proj
        routed_fp32 = routed_experts(x, ids, weights, *experts)
        bf16_weights = torch.softmax(logits, dim=-1).gather(1, in_bf16)
        routed_bf16 = routed_experts(x, in_bf16, bf16_weights / bf16_weights.sum(-1, keepdim=True), *experts)
    # the module combines with the same bf16 ops; room for one bf16 rounding (2**-8) all the same
    torch.testing.assert_close(out, routed_fp32 + shared, rtol=4e-3, atol=1e-4)
    rows = differ.nonzero().squeeze(1)
    assert not torch.allclose(out[rows].float(), (routed_bf16 + shared)[rows].float(), rtol=1e-2, atol=1e-4)
