"""The full-size Clover-35B-A3B configuration built on the meta device: parameter count and bf16
bytes (about 69 GB) without allocating any of it.

``full_size_config_json()`` (engine/model/configs/clover-35b-a3b.json) holds the published Qwen3.6-35B-A3B
text shape (40 layers as 10 x (3 Gated DeltaNet + 1 gated attention), hidden 2048, 256 experts top-8 with
intermediate 512 plus a 512 shared expert, 16 q / 2 kv heads of 256 with 25% rotary, GDN 16 key /
32 value heads of 128, vocabulary 248,320) and Clover's decoding contract with the bidirectional
GDN flag (the mask id follows this project's ``<|mask|>`` convention; see engine/text/vocab.py).
"""

from __future__ import annotations

import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from clover_agent.engine.model.config import CloverConfig, full_size_config_json
from clover_agent.engine.model.network import CloverModel

BIDIRECTIONAL_PER_GDN_LAYER = 8192 * 4 + 32 * 2  # conv1d_right [conv_dim, 1, 4] + bidir_mix_logits [32, 2]


def test_full_size_config_fields() -> None:
    config = CloverConfig.from_dict(full_size_config_json())
    assert config.num_hidden_layers == 40 and config.layer_types.count("full_attention") == 10
    assert config.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert (config.hidden_size, config.vocab_size, config.num_experts, config.num_experts_per_tok) == (
        2048,
        248320,
        256,
        8,
    )
    assert config.conv_dim == 8192 and config.rotary_dim == 64
    assert config.rope_theta == 1e7 and config.max_position_embeddings == 131072
    assert (config.mask_token_id, config.block_size, config.threshold) == (248077, 32, 0.95)
    assert config.eos_token_id == [248046, 248044] and config.bidirectional_gdn


def test_full_size_parameter_bytes_on_meta_device() -> None:
    config = CloverConfig.from_dict(full_size_config_json())
    with torch.device("meta"):
        model = CloverModel(config, kernels="torch")
    params = list(model.parameters())
    assert all(p.is_meta for p in params)  # nothing was allocated
    count = sum(p.numel() for p in params)
    bf16_bytes = 2 * count
    print(f"\nfull-size Clover (CloverModel, meta): {count:,} parameters = {bf16_bytes / 1e9:.2f} GB in bf16")
    assert 66e9 <= bf16_bytes <= 72e9

    # Oracle: transformers' model of the same text config (read by transformers itself), also on meta,
    # plus the bidirectional tensors.
    text = Qwen3_5MoeTextConfig(**full_size_config_json()["text_config"])
    with torch.device("meta"):
        reference = Qwen3_5MoeForCausalLM(text)
    reference_count = sum(p.numel() for p in reference.parameters())
    assert (
        count == reference_count + config.layer_types.count("linear_attention") * BIDIRECTIONAL_PER_GDN_LAYER
    )
