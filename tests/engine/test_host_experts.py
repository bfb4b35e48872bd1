"""Routed experts in host memory, computed by the CPU (``experts_on="host"``): on this machine the
model's device is the CPU too, so the host path runs as its own code path (``SparseMoe.host_forward``:
copies, the grouped reference) and is checked against the normal load: the same logits, the same
greedy tokens alone and in the batch engine, the expert tensors held apart from the rest, the
decoder eager with its reason, and a bad choice refused before anything is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clover_agent.engine.batching import BatchEngine
from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import EngineArgumentError
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.loading.weights import load_model
from clover_agent.engine.model.moe import RoutedExperts, SparseMoe
from clover_agent.engine.model.quantized import QuantizedRoutedExperts

#: A step's tokens (the device path's fixed grid) and a prefill's (its grouped path).
IDS = [list(range(3, 13)), [(7 * i) % 500 + 1 for i in range(70)]]
#: The device path sums a step's experts in float32 (``torch_ops.routed_experts``' fixed grid), the
#: host path in float64, and logits come back as float32: they agree to float32 rounding, within
#: this share of the largest logit's magnitude, not bit for bit.
TOLERANCE = 1e-6


def _load(folder: Path, **kwargs: object) -> Engine:
    return Engine.from_pretrained(folder, progress=None, kernels="torch", dtype=torch.float64, **kwargs)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("host-experts") / "ckpt", peaked=True, seed=5)


def _moes(engine: Engine) -> list[SparseMoe]:
    return [m for m in engine.model.modules() if isinstance(m, SparseMoe)]


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


@pytest.mark.parametrize("experts", ["dense", "int4"])
def test_host_experts_give_the_logits_of_the_normal_load(folder: Path, experts: str) -> None:
    device, host = _load(folder, experts=experts), _load(folder, experts=experts, experts_on="host")
    assert device.model.experts_on == "device" and host.model.experts_on == "host"
    assert host.dtype == torch.float64
    for ids in IDS:
        want = device.logits(ids)
        scale = want.abs().max().item()
        torch.testing.assert_close(host.logits(ids), want, rtol=0, atol=TOLERANCE * scale)


@pytest.mark.parametrize("experts", ["dense", "int4"])
def test_the_expert_tensors_are_separate_host_tensors(folder: Path, experts: str) -> None:
    engine = _load(folder, experts=experts, experts_on="host")
    kind = RoutedExperts if experts == "dense" else QuantizedRoutedExperts
    routed: list[torch.Tensor] = []
    for moe in _moes(engine):
        assert moe.experts_on == "host" and isinstance(moe.experts, kind)
        routed += [*moe.experts.parameters(), *moe.experts.buffers()]
    assert routed and all(t.device.type == "cpu" for t in routed)
    routed_ids = {id(t) for t in routed}
    rest = [t for t in [*engine.model.parameters(), *engine.model.buffers()] if id(t) not in routed_ids]
    assert rest and all(t.device == engine.device for t in rest)
    # Allocated apart: no expert tensor shares memory with anything that stays on the device.
    assert not _storages(routed) & _storages(rest)
    assert len(_storages(routed)) == len(routed)  # each its own allocation (no pinning on the CPU)


def test_the_decoder_runs_eager_and_says_why(folder: Path) -> None:
    engine = _load(folder, experts_on="host", cuda_graphs=True)
    assert not engine.decoder.cuda_graphs
    assert engine.decoder.eager_reason is not None
    assert "routed experts are in host memory" in engine.decoder.eager_reason
    assert engine.decoding_steps().startswith("eager: the routed experts are in host memory")


@pytest.mark.parametrize("experts", ["dense", "int4"])
def test_greedy_decoding_gives_the_same_tokens(folder: Path, experts: str) -> None:
    device, host = _load(folder, experts=experts), _load(folder, experts=experts, experts_on="host")
    for mode in ("diffusion", "autoregressive"):
        params = {"max_new_tokens": 48, "mode": mode}
        want = device.generate(IDS[1], device.default_params(**params)).token_ids
        got = host.generate(IDS[1], host.default_params(**params)).token_ids
        assert got == want and len(got) > 0, mode


def test_the_batch_engine_packs_host_expert_forwards(folder: Path) -> None:
    """Several calls at once go through the packed forwards (``forward_packed``), which call the same
    MoE: each call's tokens are the ones it gets alone from the normal load."""
    device, host = _load(folder), _load(folder, experts_on="host")
    prompts = [IDS[0], IDS[1], [40 + (i * 11) % 300 for i in range(33)]]
    params = device.default_params(max_new_tokens=40)
    want = [device.generate(p, params).token_ids for p in prompts]
    batch = BatchEngine(host, max_running=4)
    try:
        requests = [batch.submit(p, host.default_params(max_new_tokens=40)) for p in prompts]
        got = [request.result(timeout=300).token_ids for request in requests]
        stats = batch.stats()
    finally:
        assert batch.close(timeout=60)
    assert batch.packed and got == want
    assert stats.finished == len(prompts) and stats.forwards_per_step > 1, stats


def test_a_bad_place_is_refused_before_loading(folder: Path) -> None:
    with pytest.raises(
        EngineArgumentError, match=r"unknown experts_on choice 'gpu' \(choose from device, host\)"
    ):
        load_model(folder, progress=None, experts_on="gpu")
    with pytest.raises(EngineArgumentError, match="experts_on"):
        load_model(folder / "missing", progress=None, experts_on="cuda")  # before the folder is read
