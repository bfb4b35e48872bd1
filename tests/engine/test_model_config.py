"""CloverConfig from the config.json forms the engine accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.model.config import CloverConfig, full_size_config_json
from tests.engine.checkpoints import tiny_text_config

# The full model's text fields in the flat form, without layer_types (derived from full_attention_interval).
FULL_TEXT_CONFIG = {k: v for k, v in full_size_config_json()["text_config"].items() if k != "layer_types"}


def test_flat_text_config_with_defaults() -> None:
    config = CloverConfig.from_dict(FULL_TEXT_CONFIG)
    assert config.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert config.layer_types.count("full_attention") == 10
    assert config.conv_dim == 8192 and config.rotary_dim == 64
    assert config.rope_theta == 1e7
    assert config.eos_token_id == [248046]
    assert config.mask_token_id is None and config.block_size == 32 and config.threshold == 0.95
    assert not config.bidirectional_gdn and config.right_conv_kernel_size == 4
    assert config.max_position_embeddings == 131072


def test_nested_config_with_top_level_diffusion_fields() -> None:
    text = {k: v for k, v in FULL_TEXT_CONFIG.items() if k not in ("model_type", "eos_token_id")}
    data = {
        "model_type": "qwen3_5_moe",
        "text_config": {**text, "model_type": "qwen3_5_moe_text", "eos_token_id": 1},
        "vision_config": {"depth": 27},
        "mask_token_id": 248077,
        "block_size": 16,
        "threshold": 0.9,
        "eos_token_id": [248046, 248044],
        "bidirectional_gdn": True,
        "right_conv_kernel_size": 3,
    }
    config = CloverConfig.from_dict(data)
    assert config.model_type == "qwen3_5_moe"
    assert config.mask_token_id == 248077 and config.block_size == 16 and config.threshold == 0.9
    assert config.eos_token_id == [248046, 248044]
    assert config.bidirectional_gdn and config.right_conv_kernel_size == 3


def test_diffusion_fields_inside_text_config_and_old_rope_keys() -> None:
    text = {k: v for k, v in FULL_TEXT_CONFIG.items() if k != "rope_parameters"}
    text.update(rope_theta=5e6, partial_rotary_factor=0.5, mask_token_id=7)
    config = CloverConfig.from_dict({"model_type": "qwen3_5_moe", "text_config": text})
    assert config.rope_theta == 5e6 and config.rotary_dim == 128 and config.mask_token_id == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "qwen3_moe"}, "unsupported model_type 'qwen3_moe'"),
        ({"num_experts": None, "vocab_size": None}, "missing required field(s): vocab_size, num_experts"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4}}, "rope_type 'yarn'"),
        ({"layer_types": ["linear_attention"] * 39 + ["sliding"]}, "unknown layer types ['sliding']"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"rope_parameters": "default"}, "rope_parameters must be a JSON object (got 'default')"),
        ({"mask_token_id": 248320}, "mask_token_id 248320 is outside the vocabulary [0, 248320)"),
        ({"eos_token_id": "<|im_end|>"}, "eos_token_id must be a token id or a list of token ids"),
        ({"eos_token_id": [1, "2"]}, "eos_token_id must be a token id or a list of token ids"),
    ],
)
def test_bad_configs_are_explained(change: dict, message: str) -> None:
    data = {k: v for k, v in {**FULL_TEXT_CONFIG, **change}.items() if v is not None}
    with pytest.raises(ValueError) as error:
        CloverConfig.from_dict(data)
    assert message in str(error.value)


def test_nested_form_needs_text_config() -> None:
    with pytest.raises(ValueError, match="needs a 'text_config'"):
        CloverConfig.from_dict({"model_type": "qwen3_5_moe", **tiny_text_config()})


def test_from_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match=str(path)):
        CloverConfig.from_file(path)
    path.write_text(json.dumps({"model_type": "qwen3_5_moe_text"}))
    with pytest.raises(CheckpointError, match=f"{path}: missing required field"):
        CloverConfig.from_file(tmp_path)
    path.write_text(json.dumps({"model_type": "qwen3_5_moe_text", **tiny_text_config()}))
    assert CloverConfig.from_file(tmp_path).hidden_size == 64
