"""The per-operator kernel contract: each operator resolved on its own, ``"auto"`` falling back
to PyTorch operator by operator, ``"triton"`` naming every operator it cannot provide, and an
engine running with one operator replaced and the others from PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.engine import ops
from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import EngineArgumentError
from clover_agent.engine.sampling import SamplingParams
from tests.engine.checkpoints import relative_error
from tests.engine.test_model_ops import literal_delta_rule


def literal_gated_delta_rule(q, k, v, g, beta, state, scale):  # type: ignore[no-untyped-def]
    """The delta rule step by step in float64 (test_model_ops' oracle), as an operator: float32 out."""
    out, final = literal_delta_rule(q, k, v, g, beta, state, scale)
    return out.float(), final.float()


def test_one_operator_replaced_and_the_others_from_torch(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ops._REGISTRY["gated_delta_rule"], "literal", literal_gated_delta_rule)
    reference = Engine.from_pretrained(checkpoint, kernels="torch", progress=None)
    mixed = Engine.from_pretrained(checkpoint, kernels={"gated_delta_rule": "literal"}, progress=None)
    table = mixed.model.ops
    assert table.backends == {**dict.fromkeys(ops.OP_NAMES, "torch"), "gated_delta_rule": "literal"}
    assert table.gated_delta_rule is literal_gated_delta_rule and table.attention is ops.attention
    assert table.backend == "mixed"
    ids = list(range(5, 75))
    assert relative_error(mixed.logits(ids), reference.logits(ids)) <= 1e-4
    params = SamplingParams(max_new_tokens=40)
    assert mixed.generate(ids[:37], params).token_ids == reference.generate(ids[:37], params).token_ids


def test_auto_takes_each_usable_triton_operator_on_cuda_and_torch_for_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolution only (no GPU here): one provider imports, one is broken, four are missing."""
    monkeypatch.setattr(
        ops,
        "TRITON_PROVIDERS",
        {
            "rms_norm": ("clover_agent.engine.ops", "rms_norm"),
            "attention": ("clover_agent.kernels.absent", "fn"),
        },
    )
    monkeypatch.setattr(ops.importlib.util, "find_spec", lambda name: object())  # "triton is installed"
    cuda = ops.resolve_ops("auto", "cuda")
    assert cuda.backends == {**dict.fromkeys(ops.OP_NAMES, "torch"), "rms_norm": "triton"}
    assert ops.resolve_ops("auto", "cpu").backend == "torch"  # the interpreter is never automatic
    with pytest.raises(EngineArgumentError) as forced:
        ops.resolve_ops("triton", "cuda")
    message = str(forced.value)
    assert "attention (clover_agent.kernels.absent.fn cannot be imported" in message
    for op in ("gated_rms_norm", "causal_conv1d", "gated_delta_rule", "moe_experts"):
        assert f"{op} (no Triton kernel in this build)" in message
    assert "of rms_norm" not in message and "; rms_norm" not in message
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        EngineArgumentError, match="rms_norm \\(Triton runs on the CPU only under TRITON_INTERPRET=1\\)"
    ):
        ops.resolve_ops({"rms_norm": "triton"}, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ops.resolve_ops({"rms_norm": "triton"}, "cpu").backends["rms_norm"] == "triton"


def test_a_bad_choice_fails_when_the_engine_loads(checkpoint: Path) -> None:
    with pytest.raises(EngineArgumentError, match="kernels='triton' on cpu: no usable implementation"):
        Engine.from_pretrained(checkpoint, kernels="triton", progress=None)
    with pytest.raises(EngineArgumentError, match="unknown operator"):
        Engine.from_pretrained(checkpoint, kernels={"flash": "torch"}, progress=None)


TRITON_OPS = sorted(ops.TRITON_PROVIDERS)


@pytest.mark.parametrize("op", TRITON_OPS)
def test_each_triton_operator_alone_matches_torch_under_the_interpreter(
    checkpoint: Path, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Triton kernel the build has, replacing its operator alone (empty until kernels land)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reference = Engine.from_pretrained(checkpoint, kernels="torch", progress=None)
    single = Engine.from_pretrained(checkpoint, kernels={op: "triton"}, progress=None)
    ids = list(range(5, 45))
    assert relative_error(single.logits(ids), reference.logits(ids)) <= 1e-4
