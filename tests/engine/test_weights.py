"""Checkpoint loading: layouts, sharding, dtype conversion, progress, and errors that name the
file or tensor at fault."""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import pty
import select
import shutil
from pathlib import Path

import pytest
import torch

from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.loading.weights import load_model
from tests.engine.checkpoints import (
    convert_checkpoint,
    read_tensors,
    relative_error,
    save_reference_checkpoint,
    write_tensors,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("hf")
    return folder, save_reference_checkpoint(folder, seed=2)


def copy_checkpoint(source: Path, dst: Path) -> Path:
    shutil.copytree(source, dst)
    return dst


def rewrite(folder: Path, change: dict[str, torch.Tensor | None]) -> None:
    """Replace (or with None, delete) tensors of a single-file checkpoint."""
    tensors = read_tensors(folder)
    for name, tensor in change.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    write_tensors(folder, tensors)


def test_sharded_bfloat16_checkpoint_converts_to_float32(
    reference: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    source, model = reference
    folder = convert_checkpoint(
        source,
        tmp_path / "bf16",
        layout="fused",
        prefix="model.language_model.",
        dtype=torch.bfloat16,
        shards=3,
    )
    assert len(list(folder.glob("*.safetensors"))) == 3
    engine = Engine.from_pretrained(folder, dtype=torch.float32, progress=None)
    assert engine.model.lm_head.weight.dtype == torch.float32
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            param.copy_(param.to(torch.bfloat16).float())
        ids = list(range(7, 57))
        expected = rounded(torch.tensor([ids])).logits[0]
    assert relative_error(engine.logits(ids), expected) <= 1e-4


def test_vision_and_mtp_tensors_are_skipped_and_reported(
    reference: tuple[Path, torch.nn.Module], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, model = reference
    folder = convert_checkpoint(source, tmp_path / "vl", prefix="model.language_model.", nested_config=True)
    rewrite(
        folder,
        {"model.visual.blocks.0.attn.qkv.weight": torch.zeros(6, 2), "mtp.fc.weight": torch.zeros(2, 2)},
    )
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="clover_agent.engine.loading.weights"):
        engine = Engine.from_pretrained(folder, progress=stream)
    assert "skipping 2 tensor(s) the engine does not use: model.visual.* (1), mtp.* (1)" in stream.getvalue()
    assert "model.visual.blocks.0.attn.qkv.weight, mtp.fc.weight" in caplog.text
    ids = list(range(30))
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    assert relative_error(engine.logits(ids), expected) <= 1e-4


def test_progress_and_memory_plan_go_to_the_stream(reference: tuple[Path, torch.nn.Module]) -> None:
    source, _ = reference
    stream = io.StringIO()
    load_model(source, progress=stream)
    text = stream.getvalue()
    plan = text.split("loading weights:", 1)[0]
    assert "checkpoint: 157 tensors" in plan and "model:" in plan and "float32 on cpu" in plan
    # not a terminal (a log file, a journal): whole lines, no carriage returns piling up on one line
    assert "\r" not in text and text.endswith("\n")
    lines = [line for line in text.splitlines() if line.startswith("loading weights:")]
    assert lines[0].startswith("loading weights: 1/157 tensors")
    final = lines[-1]
    assert final.startswith("loading weights: 157/157 tensors")
    assert "/s" in final and "ETA" in final


def test_progress_on_a_terminal_is_one_line_redrawn(reference: tuple[Path, torch.nn.Module]) -> None:
    """On a real terminal (a pseudo-terminal here) the line is redrawn with carriage returns and
    ends with one newline."""
    source, _ = reference
    main, side = pty.openpty()
    with open(side, "w", closefd=True) as terminal:
        load_model(source, progress=terminal)
    chunks = []
    while select.select([main], [], [], 0.5)[0]:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the other side is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    text = b"".join(chunks).decode().replace("\r\n", "\n")  # the terminal's own newline mapping
    progress = text[text.index("\rloading weights:") :]
    assert progress.count("\n") == 1 and progress.endswith("\n")
    assert progress.rstrip("\n").split("\r")[-1].startswith("loading weights: 157/157 tensors")


def test_quiet_load_prints_nothing(
    reference: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = reference
    Engine.from_pretrained(source, progress=None)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_folder_without_tokenizer_loads_with_no_tokenizer(reference: tuple[Path, torch.nn.Module]) -> None:
    source, _ = reference
    engine = Engine.from_pretrained(source, progress=None)
    assert engine.tokenizer is None
    assert engine.device == torch.device("cpu")


# ---- errors ----------------------------------------------------------------------------------


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nowhere"):
        Engine.from_pretrained(tmp_path / "nowhere", progress=None)


def test_missing_config(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "c")
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: config file not found"):
        Engine.from_pretrained(folder, progress=None)


def test_no_safetensors(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "c")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        Engine.from_pretrained(folder, progress=None)


def test_missing_shard_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = convert_checkpoint(reference[0], tmp_path / "s", shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors"):
        Engine.from_pretrained(folder, progress=None)


def test_truncated_safetensors_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "t")
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        Engine.from_pretrained(folder, progress=None)


def test_garbage_safetensors_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "g")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        Engine.from_pretrained(folder, progress=None)


def test_missing_tensor_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "m")
    rewrite(
        folder,
        {"model.layers.1.self_attn.k_norm.weight": None, "model.layers.2.mlp.experts.5.up_proj.weight": None},
    )
    with pytest.raises(CheckpointError) as error:
        Engine.from_pretrained(folder, progress=None)
    assert "model.layers.1.self_attn.k_norm.weight" in str(error.value)
    assert "model.layers.2.mlp.experts.gate_up_proj (experts [5]" in str(error.value)


def test_missing_lm_head_named_when_untied(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "h")
    rewrite(folder, {"lm_head.weight": None})
    with pytest.raises(CheckpointError, match=r"missing tensor for lm_head\.weight"):
        Engine.from_pretrained(folder, progress=None)


def test_unknown_tensor_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "u")
    rewrite(
        folder, {"model.layers.0.linear_attn.surprise.weight": torch.zeros(3), "decoder.head": torch.zeros(2)}
    )
    with pytest.raises(CheckpointError) as error:
        Engine.from_pretrained(folder, progress=None)
    message = str(error.value)
    assert "do not fit the model layout" in message
    assert "model.layers.0.linear_attn.surprise.weight (model.safetensors" in message
    assert "decoder.head" in message


def test_shape_mismatch_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "x")
    rewrite(folder, {"model.layers.0.linear_attn.in_proj_z.weight": torch.zeros(64, 63)})
    with pytest.raises(
        CheckpointError,
        match=r"in_proj_z\.weight \(model\.safetensors\): shape \[64, 63\], expected \[64, 64\]",
    ):
        Engine.from_pretrained(folder, progress=None)


def test_dtype_mismatch_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "d")
    rewrite(folder, {"model.norm.weight": torch.zeros(64, dtype=torch.int32)})
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight \(model\.safetensors\): dtype I32"):
        Engine.from_pretrained(folder, progress=None)


def test_expert_out_of_range_named(reference: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "e")
    rewrite(folder, {"model.layers.3.mlp.experts.8.down_proj.weight": torch.zeros(64, 32)})
    with pytest.raises(CheckpointError, match=r"experts\.8\.down_proj\.weight .*expert 8 does not exist"):
        Engine.from_pretrained(folder, progress=None)


def test_fused_and_per_expert_together_is_an_error(
    reference: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    source = reference[0]
    fused = read_tensors(convert_checkpoint(source, tmp_path / "f", layout="fused"))
    folder = copy_checkpoint(source, tmp_path / "both")
    rewrite(folder, {"model.layers.0.mlp.experts.down_proj": fused["model.layers.0.mlp.experts.down_proj"]})
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.0\.mlp\.experts\.down_proj: present both fused and per expert"
    ):
        Engine.from_pretrained(folder, progress=None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "unsupported model_type 'llama'"),
        ({"hidden_size": None}, "missing required field"),
        ({"layer_types": ["linear_attention"]}, "layer_types has 1 entries"),
    ],
)
def test_bad_config_named(
    reference: tuple[Path, torch.nn.Module], tmp_path: Path, change: dict, message: str
) -> None:
    folder = copy_checkpoint(reference[0], tmp_path / "cfg")
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        Engine.from_pretrained(folder, progress=None)
    assert str(folder / "config.json") in str(error.value)
    assert message in str(error.value)


def test_tied_checkpoint_ignores_a_stored_head_copy(tmp_path: Path) -> None:
    folder = tmp_path / "tied"
    model = save_reference_checkpoint(folder, seed=6, tie_word_embeddings=True)
    rewrite(folder, {"lm_head.weight": torch.randn(512, 64)})
    stream = io.StringIO()
    engine = Engine.from_pretrained(folder, progress=stream)
    assert "lm_head.weight (1)" in stream.getvalue()
    assert engine.model.lm_head.weight is engine.model.embed_tokens.weight
    ids = list(range(20))
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    assert relative_error(engine.logits(ids), expected) <= 1e-4
