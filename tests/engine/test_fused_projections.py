"""Each layer's input projections as one GEMM (``engine/model/fused.FusedInputs``: a Gated DeltaNet
layer's four, an attention layer's q / k / v): the same logits as separate GEMMs, no extra memory,
the checkpoint's parameter names and values unchanged."""

from __future__ import annotations

from pathlib import Path

import torch

from clover_agent.engine.engine import Engine
from clover_agent.engine.model.attention import GatedAttention
from clover_agent.engine.model.fused import FusedInputs
from clover_agent.engine.model.gdn import GatedDeltaNet
from clover_agent.engine.model.network import CloverModel


def mixers(model: CloverModel) -> list[FusedInputs]:
    found = [
        layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn for layer in model.layers
    ]
    # both kinds are here, with the projections each fuses
    assert {type(m) for m in found} == {GatedDeltaNet, GatedAttention}
    for mixer in found:
        names = [name for name, module in mixer.named_children() if module in mixer.input_projections()]
        if isinstance(mixer, GatedAttention):
            assert names == ["q_proj", "k_proj", "v_proj"]
        else:
            assert names == ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
    return found


def views_of_the_fused_matrix(layer: FusedInputs) -> bool:
    fused = layer._fused
    assert fused is not None
    return all(
        p.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
        for p in layer.input_projections()
    )


def test_loaded_models_are_fused_and_compute_what_four_gemms_do(two_layer_checkpoint: Path) -> None:
    fused = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    layers = mixers(fused)
    assert layers and all(views_of_the_fused_matrix(layer) for layer in layers)
    plain = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    for layer in mixers(plain):
        layer._fused = None  # back to separate GEMMs (the parameters hold the same values)
    assert fused.state_dict().keys() == plain.state_dict().keys()
    for name, tensor in fused.state_dict().items():
        assert torch.equal(tensor, plain.state_dict()[name]), name  # exact: copied, not computed
    # no copy kept: the parameters are the fused matrix's rows
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())

    x = torch.randn(7, fused.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in layers:
        parts = layer.input_projections()
        got_parts = layer.project(x)
        assert [t.shape[-1] for t in got_parts] == [p.out_features for p in parts]
        for got, part in zip(got_parts, parts, strict=True):
            # one GEMM's slice against that part's own GEMM: the same dot products, blocked differently
            torch.testing.assert_close(got, part(x), rtol=1e-5, atol=1e-5)

    ids = torch.arange(5, 45)
    for rule in ("block", "causal"):
        got = fused(ids, fused.new_cache(), attention=rule)
        want = plain(ids, plain.new_cache(), attention=rule)
        # One GEMM of the parts' summed widths: each output is the same dot product, which BLAS may
        # block differently for another matrix width (float32 logits up to ~80); a wrong slice or
        # order moves them by O(1).
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=rule)


def test_moving_a_fused_model_fuses_it_again(two_layer_checkpoint: Path) -> None:
    model = Engine.from_pretrained(two_layer_checkpoint, progress=None).model
    before = model(torch.arange(5, 37), model.new_cache(), attention="block")
    model.to(torch.float64)
    for layer in mixers(model):
        assert layer._fused is not None and layer._fused.dtype == torch.float64
        assert views_of_the_fused_matrix(layer)
    after = model(torch.arange(5, 37), model.new_cache(), attention="block")
    torch.testing.assert_close(after.float(), before, rtol=1e-4, atol=1e-4)  # float64 against float32
