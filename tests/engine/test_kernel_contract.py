"""The per-operator kernel contract: each operator resolved on its own, ``"auto"`` falling back to
PyTorch operator by operator, ``"triton"`` naming every operator it cannot provide, and the engine
with Triton kernels (in the interpreter here) against the engine with PyTorch ones: each operator
replaced alone, then all of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clover_agent.engine import ops
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import EngineArgumentError
from tests.engine.checkpoints import relative_error


def literal_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The zero-centred RMSNorm written out in float64: an operator of another backend."""
    x64 = x.double()
    return (x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * (1 + weight.double())).to(x.dtype)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Engine:
    return Engine.from_pretrained(checkpoint, kernels="torch", progress=None)


@pytest.fixture(scope="module")
def small_reference(two_layer_checkpoint: Path) -> Engine:
    return Engine.from_pretrained(two_layer_checkpoint, kernels="torch", progress=None)


def test_one_operator_replaced_and_the_others_from_torch(
    checkpoint: Path, reference: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ops._REGISTERED, "rms_norm", {"literal": literal_rms_norm})
    mixed = Engine.from_pretrained(checkpoint, kernels={"rms_norm": "literal"}, progress=None)
    table = mixed.model.ops
    assert table.backends == {**dict.fromkeys(ops.OP_NAMES, "torch"), "rms_norm": "literal"}
    assert table.rms_norm is literal_rms_norm and table.backend == "mixed"
    assert table.attention is reference.model.ops.attention
    ids = list(range(5, 75))
    assert relative_error(mixed.logits(ids), reference.logits(ids)) <= 1e-4
    params = SamplingParams(max_new_tokens=40)
    assert mixed.generate(ids[:37], params).token_ids == reference.generate(ids[:37], params).token_ids


def test_auto_takes_each_usable_triton_operator_and_torch_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolution only: a device where Triton runs (here: the interpreter), one kernel broken."""
    monkeypatch.setitem(
        ops.PROVIDERS, "attention", {**ops.PROVIDERS["attention"], "triton": "clover_agent.kernels.absent:fn"}
    )
    monkeypatch.setattr(ops, "triton_unusable", lambda device: None)
    table = ops.resolve_ops("auto", "cuda")
    assert table.backends == {**dict.fromkeys(ops.OP_NAMES, "triton"), "attention": "torch"}
    assert ops.resolve_ops("auto", "cpu").backend == "torch"  # the interpreter is never automatic
    with pytest.raises(EngineArgumentError) as forced:
        ops.resolve_ops("triton", "cuda")
    assert "attention (clover_agent.kernels.absent:fn cannot be loaded" in str(forced.value)
    assert "rms_norm" not in str(forced.value)


def test_triton_needs_the_interpreter_on_the_cpu(monkeypatch: pytest.MonkeyPatch, checkpoint: Path) -> None:
    # Every operator's modules imported first, while TRITON_INTERPRET=1: Triton decides at decoration
    # whether a kernel is interpreted, and a kernel module first imported in the window below (a
    # PyTorch reference's package imports its launchers) would stay compiled-only for the rest of
    # this worker's tests.
    for op in ops.OP_NAMES:
        ops.load(op, "torch"), ops.load(op, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        EngineArgumentError, match="rms_norm \\(Triton runs on the CPU only under TRITON_INTERPRET=1\\)"
    ):
        ops.resolve_ops({"rms_norm": "triton"}, "cpu")
    with pytest.raises(EngineArgumentError, match="kernels='triton' on cpu: no usable implementation"):
        Engine.from_pretrained(checkpoint, kernels="triton", progress=None)
    with pytest.raises(EngineArgumentError, match="unknown operator"):
        Engine.from_pretrained(checkpoint, kernels={"flash": "torch"}, progress=None)


@pytest.mark.parametrize("op", ops.OP_NAMES)
def test_each_triton_operator_alone_matches_torch(
    two_layer_checkpoint: Path, small_reference: Engine, op: str
) -> None:
    """33 tokens: a whole block and one more (block-causal attention across two blocks)."""
    single = Engine.from_pretrained(two_layer_checkpoint, kernels={op: "triton"}, progress=None)
    assert single.model.ops.backends == {**dict.fromkeys(ops.OP_NAMES, "torch"), op: "triton"}
    ids = list(range(5, 38))
    assert relative_error(single.logits(ids), small_reference.logits(ids)) <= 1e-4


@pytest.mark.slow
def test_the_engine_on_triton_kernels_matches_the_engine_on_torch(
    two_layer_checkpoint: Path, small_reference: Engine
) -> None:
    """Every operator a Triton kernel (run by the interpreter): logits within 1e-4, and a greedy
    diffusion decode token-identical, through a 32-token denoise and a fused 64-token commit."""
    triton = Engine.from_pretrained(two_layer_checkpoint, kernels="triton", progress=None)
    assert triton.model.ops.backend == "triton"
    ids = list(range(5, 38))
    assert relative_error(triton.logits(ids), small_reference.logits(ids)) <= 1e-4
    params = SamplingParams(max_new_tokens=34, fuse_commit=True)
    expected = small_reference.generate(ids[:30], params)
    got = triton.generate(ids[:30], params)
    assert got.token_ids == expected.token_ids and got.steps_per_block == expected.steps_per_block
    assert len(got.steps_per_block) == 2  # the second block's first pass was the fused 64-token one
