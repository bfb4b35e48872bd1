"""Tiny checkpoints for engine tests, written by transformers itself and converted between layouts.

Stable helpers (other engine tests reuse them):

* :func:`tiny_text_config` — keyword arguments of a small ``Qwen3_5MoeTextConfig`` (hidden 64,
  4 layers mixing GDN and attention, 8 experts top-2, vocabulary 512), with overrides.
* :func:`save_reference_checkpoint` — builds ``Qwen3_5MoeForCausalLM`` with every parameter
  perturbed away from its init value (norms, ``A_log`` and ``dt_bias`` included), saves it with
  ``save_pretrained`` (transformers 5.x writes per-expert tensors under ``model.``) and returns the
  model in eval mode as the logits oracle.
* :func:`convert_checkpoint` — a copy of a saved checkpoint with another expert layout
  (``"per_expert"`` / ``"fused"``), prefix (``"model."`` / ``"model.language_model."``), dtype,
  number of shards (an index file when > 1) and optionally the nested ``qwen3_5_moe`` config form.
* :func:`add_bidirectional_tensors` — writes random Clover bidirectional GDN tensors into a
  checkpoint folder (an extra shard) and sets ``bidirectional_gdn`` in its config.
* :func:`read_tensors` / :func:`write_tensors` — whole-checkpoint tensor dicts (tiny sizes only).
* :func:`relative_error` — how far a result is from the oracle's, relative to the oracle's largest value.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

TINY_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_conv_kernel_dim": 4,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 1024,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}


def tiny_text_config(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments of a tiny ``Qwen3_5MoeTextConfig``; ``overrides`` replace entries."""
    return {**TINY_TEXT_CONFIG, **overrides}


def save_reference_checkpoint(out_dir: Path, *, seed: int = 0, noise: float = 0.1, **overrides: Any) -> Any:
    """Save a perturbed random tiny ``Qwen3_5MoeForCausalLM`` to ``out_dir``; return it (eval mode)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(seed)
    config = Qwen3_5MoeTextConfig(**tiny_text_config(**overrides))
    model = Qwen3_5MoeForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * noise)
    model.save_pretrained(out_dir)
    return model


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute expected value (in float64)."""
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder (every ``*.safetensors`` file)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def write_tensors(out_dir: Path, tensors: dict[str, torch.Tensor], *, shards: int = 1) -> None:
    """Write ``tensors`` as one file, or ``shards`` files plus ``model.safetensors.index.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.safetensors"):
        old.unlink()
    (out_dir / "model.safetensors.index.json").unlink(missing_ok=True)
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(out_dir / "model.safetensors"))
        return
    weight_map: dict[str, str] = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        save_file({n: tensors[n].contiguous() for n in part}, str(out_dir / file))
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _PER_EXPERT.match(name)
        if match:
            groups.setdefault(match.group(1), {})[(int(match.group(2)), match.group(3))] = tensor
        else:
            out[name] = tensor
    for base, parts in groups.items():
        count = 1 + max(e for e, _ in parts)
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(count)]
        )
        out[f"{base}.down_proj"] = torch.stack([parts[(e, "down_proj")] for e in range(count)])
    return out


def convert_checkpoint(
    src: Path,
    dst: Path,
    *,
    layout: str = "per_expert",
    prefix: str = "model.",
    dtype: torch.dtype | None = None,
    shards: int = 1,
    nested_config: bool = False,
) -> Path:
    """Copy checkpoint ``src`` (per-expert, ``model.`` prefix, as transformers saves it) to ``dst``
    with the given expert layout, prefix, dtype, shard count and config form. Returns ``dst``."""
    if layout not in ("per_expert", "fused"):
        raise ValueError(f"unknown layout {layout!r}")
    tensors = read_tensors(src)
    if layout == "fused":
        tensors = _fuse_experts(tensors)
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith("model."):
            name = prefix + name.removeprefix("model.")
        renamed[name] = tensor.to(dtype) if dtype is not None else tensor
    write_tensors(dst, renamed, shards=shards)
    config = json.loads((src / "config.json").read_text())
    if nested_config:
        config = {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "tie_word_embeddings": config.get("tie_word_embeddings", False),
            "text_config": config,
            "vision_config": {"model_type": "qwen3_5_moe_vision"},
        }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / extra).is_file():
            shutil.copy(src / extra, dst / extra)
    return dst


def add_bidirectional_tensors(
    model_dir: Path, *, seed: int = 0, kernel: int = 4, scale: float = 0.3, flag: bool = True
) -> dict[str, torch.Tensor]:
    """Add random ``conv1d_right.weight`` / ``bidir_mix_logits`` to every GDN layer of a checkpoint
    (as ``bidirectional.safetensors``, or inside the index when sharded); returns the new tensors."""
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)
    conv_dim = 2 * text["linear_num_key_heads"] * text["linear_key_head_dim"] + (
        text["linear_num_value_heads"] * text["linear_value_head_dim"]
    )
    prefix = (
        "model.language_model."
        if any(n.startswith("model.language_model.") for n in read_tensors(model_dir))
        else "model."
    )
    generator = torch.Generator().manual_seed(seed)
    extra: dict[str, torch.Tensor] = {}
    for index, kind in enumerate(text["layer_types"]):
        if kind != "linear_attention":
            continue
        base = f"{prefix}layers.{index}.linear_attn."
        extra[base + "conv1d_right.weight"] = torch.randn(conv_dim, 1, kernel, generator=generator) * scale
        extra[base + "bidir_mix_logits"] = torch.randn(text["linear_num_value_heads"], 2, generator=generator)
    save_file(extra, str(model_dir / "bidirectional.safetensors"))
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        index["weight_map"].update(dict.fromkeys(extra, "bidirectional.safetensors"))
        index_path.write_text(json.dumps(index, indent=2))
    if flag:
        config["bidirectional_gdn"] = True
        config["right_conv_kernel_size"] = kernel
        config_path.write_text(json.dumps(config, indent=2))
    return extra
