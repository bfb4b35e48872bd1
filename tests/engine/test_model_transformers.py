"""The engine's causal forward equals transformers' Qwen3_5MoeForCausalLM on tiny checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from clover_agent.engine.engine import Engine
from tests.engine.checkpoints import convert_checkpoint, relative_error, save_reference_checkpoint

LAYOUTS = [
    ("per_expert", "model."),
    ("fused", "model."),
    ("per_expert", "model.language_model."),
    ("fused", "model.language_model."),
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("hf")
    return folder, save_reference_checkpoint(folder, seed=0)


def test_transformers_saves_per_expert_tensors_under_model_prefix(
    reference: tuple[Path, torch.nn.Module],
) -> None:
    folder, _ = reference
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    assert "model.layers.0.mlp.experts.7.gate_proj.weight" in names
    assert not any(n.endswith("experts.gate_up_proj") for n in names)
    assert all(n.startswith("model.") or n == "lm_head.weight" for n in names)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-{p[1].rstrip('.')}")
def engine_and_reference(
    request: pytest.FixtureRequest,
    reference: tuple[Path, torch.nn.Module],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Engine, torch.nn.Module]:
    source, model = reference
    layout, prefix = request.param
    if (layout, prefix) == ("per_expert", "model."):
        folder = source  # exactly what transformers wrote
    else:
        folder = convert_checkpoint(
            source,
            tmp_path_factory.mktemp(layout),
            layout=layout,
            prefix=prefix,
            nested_config=prefix != "model.",
        )
    return Engine.from_pretrained(folder, progress=None), model


@pytest.mark.parametrize("length", [1, 31, 32, 33, 100])
def test_logits_match_transformers(engine_and_reference: tuple[Engine, torch.nn.Module], length: int) -> None:
    engine, model = engine_and_reference
    ids = torch.randint(
        0, engine.config.vocab_size, (length,), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        expected = model(ids[None]).logits[0].float()
    actual = engine.logits(ids.tolist())
    assert actual.shape == (length, engine.config.vocab_size)
    assert actual.dtype == torch.float32
    assert relative_error(actual, expected) <= 1e-4


def test_tied_embeddings_match_transformers(tmp_path: Path) -> None:
    model = save_reference_checkpoint(tmp_path, seed=3, tie_word_embeddings=True)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        assert "lm_head.weight" not in set(handle.keys())
    engine = Engine.from_pretrained(tmp_path, progress=None)
    ids = list(range(5, 45))
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    assert relative_error(engine.logits(ids), expected) <= 1e-4


def test_bfloat16_engine_tracks_transformers_in_bfloat16(reference: tuple[Path, torch.nn.Module]) -> None:
    """bf16 rounding alone moves these tiny logits a lot: a near-tie in the router flips an expert
    for a row (bf16 against float32 is ~0.45 here, for transformers as for the engine), and which
    rows flip depends on every rounding on the way. So the oracle is transformers run in bf16 too:
    most rows must stay close to it, and the engine's bf16 error against float32 must be of the size
    of transformers' own."""
    folder, model = reference
    engine = Engine.from_pretrained(folder, dtype=torch.bfloat16, progress=None)
    assert engine.model.embed_tokens.weight.dtype == torch.bfloat16
    assert engine.dtype == torch.bfloat16
    ids = list(range(100, 140))
    with torch.no_grad():
        expected = copy.deepcopy(model).to(torch.bfloat16)(torch.tensor([ids])).logits[0].float()
        exact = model(torch.tensor([ids])).logits[0].float()
    actual = engine.logits(ids)
    assert actual.dtype == torch.float32
    rows = (actual - expected).abs().max(dim=-1).values / expected.abs().max()
    assert float(rows.median()) < 0.02 and float((rows < 0.05).float().mean()) >= 0.9
    assert relative_error(actual, exact) <= 1.5 * relative_error(expected, exact) + 0.02
