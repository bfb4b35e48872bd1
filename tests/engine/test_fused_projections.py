"""Each Gated DeltaNet layer's four input projections as one GEMM (``GatedDeltaNet.fuse``): the same
logits as four GEMMs, no extra memory, the checkpoint's parameter names and values unchanged."""

from __future__ import annotations

from pathlib import Path

import torch

from clover_agent.engine.engine import Engine
from clover_agent.engine.model.gdn import GatedDeltaNet
from clover_agent.engine.model.network import CloverModel


def gdn_layers(model: CloverModel) -> list[GatedDeltaNet]:
    return [layer.linear_attn for layer in model.layers if hasattr(layer, "linear_attn")]


def views_of_the_fused_matrix(layer: GatedDeltaNet) -> bool:
    fused = layer._fused
    assert fused is not None
    parts = (layer.in_proj_qkv, layer.in_proj_z, layer.in_proj_b, layer.in_proj_a)
    return all(p.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr() for p in parts)


def test_loaded_models_are_fused_and_compute_what_four_gemms_do(two_layer_checkpoint: Path) -> None:
    fused = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    layers = gdn_layers(fused)
    assert layers and all(views_of_the_fused_matrix(layer) for layer in layers)
    plain = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    for layer in gdn_layers(plain):
        layer._fused = None  # back to four GEMMs (the parameters hold the same values)
    assert fused.state_dict().keys() == plain.state_dict().keys()
    for name, tensor in fused.state_dict().items():
        assert torch.equal(tensor, plain.state_dict()[name]), name  # exact: copied, not computed
    # no copy kept: the parameters are the fused matrix's rows
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())

    ids = torch.arange(5, 45)
    for rule in ("block", "causal"):
        got = fused(ids, fused.new_cache(), attention=rule)
        want = plain(ids, plain.new_cache(), attention=rule)
        # One GEMM of the four's summed widths: each output is the same dot product, which BLAS may
        # block differently for another matrix width (float32 logits up to ~80); a wrong slice or
        # order moves them by O(1).
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=rule)


def test_moving_a_fused_model_fuses_it_again(two_layer_checkpoint: Path) -> None:
    model = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    before = model(torch.arange(5, 37), model.new_cache(), attention="block")
    model.to(torch.float64)
    for layer in gdn_layers(model):
        assert layer._fused is not None and layer._fused.dtype == torch.float64
        assert views_of_the_fused_matrix(layer)
    after = model(torch.arange(5, 37), model.new_cache(), attention="block")
    torch.testing.assert_close(after.float(), before, rtol=1e-4, atol=1e-4)  # float64 against float32
