"""``CloverConfig``: the model's shape and decoding contract, read from a checkpoint's ``config.json``.

Accepts the two Hugging Face forms of the architecture: ``qwen3_5_moe`` (text fields nested under
``text_config``, beside a vision config the engine ignores) and ``qwen3_5_moe_text`` (flat), plus
Clover's diffusion fields, which may sit at the top level or inside ``text_config``. Building the
dataclass does no I/O; ``from_file`` is the only reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from clover_agent.engine.errors import CheckpointError

SUPPORTED_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "clover", "clover_text")
LAYER_TYPES = ("linear_attention", "full_attention")
#: The published full-size config.json (package data under ``configs/``); see :func:`full_size_config_json`.
FULL_SIZE_CONFIG_FILE = "clover-35b-a3b.json"

#: Text fields that have no sensible default: a config without them describes no model.
REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


@dataclass(frozen=True)
class CloverConfig:
    """Shapes of the hybrid Gated DeltaNet / gated attention MoE model and its decoding contract."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    model_type: str = "qwen3_5_moe_text"
    # Decoding contract (docs/decoding.md); every item can be overridden by the checkpoint.
    mask_token_id: int | None = None
    block_size: int = 32
    threshold: float = 0.95
    eos_token_id: list[int] = field(default_factory=list)
    bidirectional_gdn: bool = False
    right_conv_kernel_size: int = 4

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN short convolution: the q, k and v rows of ``in_proj_qkv``."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid model configuration: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Inconsistencies between fields (empty when the configuration is usable)."""
        out = []
        if len(self.layer_types) != self.num_hidden_layers:
            out.append(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}"
            )
        unknown = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if unknown:
            out.append(f"unknown layer types {unknown} (known: {list(LAYER_TYPES)})")
        if self.num_attention_heads % self.num_key_value_heads:
            out.append("num_attention_heads is not a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            out.append("linear_num_value_heads is not a multiple of linear_num_key_heads")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            out.append("num_experts_per_tok must be between 1 and num_experts")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            out.append(f"partial_rotary_factor {self.partial_rotary_factor} gives an unusable rotary size")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            out.append(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.block_size < 1:
            out.append("block_size must be positive")
        if self.right_conv_kernel_size < 1:
            out.append("right_conv_kernel_size must be positive")
        return out

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> CloverConfig:
        """Read ``config.json`` (or a folder holding it); errors name the file."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: config file not found")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not a readable JSON file ({exc})") from exc
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: {exc}") from exc

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CloverConfig:
        """Build from a parsed ``config.json``. Raises ``ValueError`` naming what is wrong."""
        model_type = data.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else None
        if model_type in ("qwen3_5_moe", "clover") and text is None:
            raise ValueError(f"model_type {model_type!r} needs a 'text_config' object")
        text = text if text is not None else data
        # Top-level entries (Clover's diffusion fields, tie_word_embeddings) win over nested ones.
        merged = {**text, **{k: v for k, v in data.items() if k != "text_config"}}

        missing = [name for name in REQUIRED_FIELDS if text.get(name) is None]
        if missing:
            raise ValueError(f"missing required field(s): {', '.join(missing)}")
        if text.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {text['hidden_act']!r} is not supported (only 'silu')")
        if text.get("attention_bias"):
            raise ValueError("attention_bias=true is not supported")

        num_layers = int(text["num_hidden_layers"])
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
            ]
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"rope_parameters must be a JSON object (got {rope!r})")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
        eos = merged.get("eos_token_id")
        eos_list = [] if eos is None else eos if isinstance(eos, list) else [eos]
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in eos_list):
            raise ValueError(f"eos_token_id must be a token id or a list of token ids (got {eos!r})")
        eos_ids = list(eos_list)
        heads = int(text["num_attention_heads"])
        values: dict[str, Any] = {
            "vocab_size": int(text["vocab_size"]),
            "hidden_size": int(text["hidden_size"]),
            "num_hidden_layers": num_layers,
            "layer_types": tuple(layer_types),
            "num_attention_heads": heads,
            "num_key_value_heads": int(text["num_key_value_heads"]),
            "head_dim": int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            "linear_num_key_heads": int(text["linear_num_key_heads"]),
            "linear_num_value_heads": int(text["linear_num_value_heads"]),
            "linear_key_head_dim": int(text["linear_key_head_dim"]),
            "linear_value_head_dim": int(text["linear_value_head_dim"]),
            "linear_conv_kernel_dim": int(text.get("linear_conv_kernel_dim", 4)),
            "num_experts": int(text["num_experts"]),
            "num_experts_per_tok": int(text["num_experts_per_tok"]),
            "moe_intermediate_size": int(text["moe_intermediate_size"]),
            "shared_expert_intermediate_size": int(text["shared_expert_intermediate_size"]),
            "rms_norm_eps": float(text.get("rms_norm_eps", 1e-6)),
            "rope_theta": float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
            "partial_rotary_factor": float(
                rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
            ),
            "max_position_embeddings": int(text.get("max_position_embeddings", 32768)),
            "tie_word_embeddings": bool(merged.get("tie_word_embeddings", False)),
            "model_type": str(model_type),
            "eos_token_id": eos_ids,
        }
        contract = {
            "mask_token_id": int,
            "block_size": int,
            "threshold": float,
            "bidirectional_gdn": bool,
            "right_conv_kernel_size": int,
        }
        for name, kind in contract.items():
            if merged.get(name) is not None:
                values[name] = kind(merged[name])
        return cls(**values)

    def with_overrides(self, **changes: Any) -> CloverConfig:
        """A copy with some fields replaced (e.g. ``bidirectional_gdn`` detected from the tensors)."""
        return replace(self, **changes)


def full_size_config_json() -> dict[str, Any]:
    """The full-size Clover-35B-A3B ``config.json`` shipped with the package, as parsed JSON.

    One source for the real model's shape: the meta-device size tests, the config tests and the GPU
    benchmark's ``full-layers`` preset all read it."""
    text = resources.files("clover_agent.engine.model").joinpath("configs", FULL_SIZE_CONFIG_FILE).read_text()
    return json.loads(text)
