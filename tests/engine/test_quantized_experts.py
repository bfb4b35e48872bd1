"""Quantised routed experts in the engine: an FP8 checkpoint (float8_e4m3fn weights with
``weight_scale_inv`` block scales) loads with its bytes kept, a float checkpoint is quantised on load
to FP8 or INT4, the experts take the bytes the format says, and the forward equals the engine's
with the dequantised weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import EngineArgumentError
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.model.moe import RoutedExperts
from clover_agent.engine.model.quantized import QuantizedRoutedExperts
from clover_agent.kernels.moe import quant

BLOCK = (16, 16)  # the tiny FP8 checkpoint's weight_block_size (real ones: 128 x 128)
GROUP = 32
EXPERTS, HIDDEN, INNER, LAYERS = 8, 64, 32, 4  # the tiny checkpoint's sizes
IDS = [list(range(3, 13)), [(7 * i) % 500 + 1 for i in range(70)]]  # a step (fixed grid) and a prefill


def _load(folder: Path, **kwargs: object) -> Engine:
    return Engine.from_pretrained(folder, progress=None, kernels="torch", **kwargs)


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("float") / "ckpt",
        seed=5,
        tokenizer=False,
        layout="per-expert",
        dtype=torch.bfloat16,
    )


@pytest.fixture(scope="module")
def fp8_checkpoint(float_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float checkpoint as DeepSeek / Qwen FP8 checkpoints store it: every expert matrix and
    the attention output projections in e4m3 with a float32 scale per 16 x 16 block."""
    out = tmp_path_factory.mktemp("fp8") / "ckpt"
    out.mkdir()
    tensors = load_file(str(float_checkpoint / "model.safetensors"))
    for name in list(tensors):
        if ".mlp.experts." in name or name.endswith("self_attn.o_proj.weight"):
            data, scale = quant.quantize_fp8(tensors[name], BLOCK)
            tensors[name], tensors[name + "_scale_inv"] = data, scale
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((float_checkpoint / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


def _experts(engine: Engine) -> list[torch.nn.Module]:
    return [layer.mlp.experts for layer in engine.model.layers]


def _dense_twin(folder: Path, quantised: Engine) -> Engine:
    """The engine loaded dense, its experts overwritten with the quantised engine's dequantised weights."""
    dense = _load(folder, experts="dense")
    for mine, theirs in zip(_experts(dense), _experts(quantised), strict=True):
        assert isinstance(mine, RoutedExperts) and isinstance(theirs, QuantizedRoutedExperts)
        mine.gate_up_proj.data.copy_(theirs.gate_up_proj.dequantize(torch.float32))
        mine.down_proj.data.copy_(theirs.down_proj.dequantize(torch.float32))
    return dense


def _same_logits(a: Engine, b: Engine) -> None:
    for ids in IDS:
        # the same weights and routing: the experts' matmuls differ only in which tensor (a fresh
        # dequantised one or a slice of the stack) BLAS reads, float32 all through; a layout can
        # change BLAS's kernel and summation order, which moved float32 logits of this size by
        # 1.1e-5 between two code paths on an AMD EPYC (tests/engine/test_host_syncs.py), so 1e-4
        # as there: a wrong scale or nibble moves them by O(0.1)
        torch.testing.assert_close(a.logits(ids), b.logits(ids), rtol=1e-4, atol=1e-4)


def test_fp8_checkpoint_keeps_its_bytes_and_dequantises_the_rest(fp8_checkpoint: Path) -> None:
    engine = _load(fp8_checkpoint)  # experts="auto": as stored
    stored = load_file(str(fp8_checkpoint / "model.safetensors"))
    base = "model.layers.1.mlp.experts.5"
    experts = _experts(engine)[1]
    assert isinstance(experts, QuantizedRoutedExperts) and experts.scheme == "fp8" and experts.block == BLOCK
    gate_up, down = experts.gate_up_proj, experts.down_proj
    halves = {"gate_proj": slice(0, INNER), "up_proj": slice(INNER, 2 * INNER)}
    for proj, rows in halves.items():
        got = gate_up.data[5, rows].view(torch.uint8)
        assert torch.equal(got, stored[f"{base}.{proj}.weight"].view(torch.uint8))  # exact: copied bytes
        grid = slice(rows.start // BLOCK[0], rows.stop // BLOCK[0])
        assert torch.equal(gate_up.scale[5, grid], stored[f"{base}.{proj}.weight_scale_inv"])  # exact: copied
    assert torch.equal(
        down.data[5].view(torch.uint8), stored[f"{base}.down_proj.weight"].view(torch.uint8)
    )  # exact: copied bytes
    o_proj = "model.layers.3.self_attn.o_proj.weight"
    want = quant.dequantize_fp8(stored[o_proj], stored[o_proj + "_scale_inv"], BLOCK, torch.float32)
    got = engine.model.layers[3].self_attn.o_proj.weight
    assert torch.equal(got, want)  # exact: the same dequantisation, float32 both
    _same_logits(engine, _dense_twin(fp8_checkpoint, engine))


@pytest.mark.parametrize("scheme", quant.SCHEMES)
def test_quantise_on_load(float_checkpoint: Path, scheme: str) -> None:
    engine = _load(float_checkpoint, experts=scheme, int4_group=GROUP)
    stored = load_file(str(float_checkpoint / "model.safetensors"))
    experts = _experts(engine)[2]
    assert isinstance(experts, QuantizedRoutedExperts) and experts.scheme == scheme
    gate = stored["model.layers.2.mlp.experts.3.gate_proj.weight"].float()
    data, scale = quant.quantize_one(gate, scheme, group=GROUP)
    assert torch.equal(
        experts.gate_up_proj.data[3, :INNER].view(torch.uint8), data.view(torch.uint8)
    )  # exact: same function
    assert torch.equal(experts.gate_up_proj.scale[3, : scale.shape[0]], scale)  # exact: same function

    # bytes of all the layers' routed experts, from the format (dense float32: 4 bytes a weight)
    weights = EXPERTS * 3 * INNER * HIDDEN
    if scheme == "fp8":  # one byte a weight, a float32 scale per 128 x 128 block of each matrix
        want = weights + EXPERTS * 3 * 4
    else:  # half a byte a weight, a float16 scale per 32 inputs of each row
        want = weights // 2 + EXPERTS * (2 * INNER * HIDDEN // GROUP + HIDDEN * INNER // GROUP) * 2
    assert sum(e.nbytes for e in _experts(engine)) == LAYERS * want
    dense = _load(float_checkpoint, experts="dense")
    dense_bytes = sum(p.numel() * p.element_size() for e in _experts(dense) for p in e.parameters())
    assert dense_bytes == LAYERS * weights * 4
    _same_logits(engine, _dense_twin(float_checkpoint, engine))


def test_fp8_checkpoint_requantised_to_int4_and_dense(fp8_checkpoint: Path, float_checkpoint: Path) -> None:
    """Other choices read the FP8 bytes through their scales: dense gets them exactly."""
    int4 = _load(fp8_checkpoint, experts="int4", int4_group=GROUP)
    assert {e.scheme for e in _experts(int4)} == {"int4"}
    dense = _load(fp8_checkpoint, experts="dense")
    fp8 = _load(fp8_checkpoint)
    for mine, theirs in zip(_experts(dense), _experts(fp8), strict=True):
        assert torch.equal(mine.down_proj, theirs.down_proj.dequantize(torch.float32))  # exact: same function


def test_bad_choices_are_refused(float_checkpoint: Path) -> None:
    with pytest.raises(EngineArgumentError, match="unknown experts choice"):
        _load(float_checkpoint, experts="int3")
    with pytest.raises(EngineArgumentError, match="int4_group"):
        _load(float_checkpoint, experts="int4", int4_group=48)


@pytest.mark.parametrize("scheme", quant.SCHEMES)
def test_triton_experts_read_the_quantised_weights(float_checkpoint: Path, scheme: str) -> None:
    """The MoE operator from Triton (interpreted on the CPU) on the quantised experts."""
    torch_engine = _load(float_checkpoint, experts=scheme, int4_group=GROUP)
    triton_engine = Engine.from_pretrained(
        float_checkpoint, progress=None, kernels={"sparse_moe": "triton"}, experts=scheme, int4_group=GROUP
    )
    assert triton_engine.model.ops.backends["sparse_moe"] == "triton"
    ids = IDS[0]
    # float32 both; the grouped GEMM against the fixed-grid matmuls: op order (docs/decoding.md: 1e-4)
    torch.testing.assert_close(triton_engine.logits(ids), torch_engine.logits(ids), rtol=1e-4, atol=1e-4)
