"""``clover-agent model pull`` (download the Clover weights) and ``clover-agent model info DIR``
(what the engine sees in a checkpoint folder, read from headers without loading any tensor)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from clover_agent.engine.loading.locate import HF_REPO_ID
from clover_agent.errors import CloverError, ExitCode, ModelUnavailable, UsageError

#: Network libraries under huggingface_hub whose exceptions mean "the hub could not be reached".
_NETWORK_MODULES = frozenset({"httpx", "httpx2", "httpcore", "requests", "urllib3"})
_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


# ---- pull ------------------------------------------------------------------------------------
def _unreachable(endpoint: str, reason: str) -> ModelUnavailable:
    return ModelUnavailable(
        f"cannot reach the Hugging Face Hub at {endpoint} to download {HF_REPO_ID} ({reason}). "
        "Check the network or proxy (HTTPS_PROXY, HF_ENDPOINT), or copy a downloaded checkpoint here "
        "and pass --model DIR (or set CLOVER_MODEL). A download that was cut off resumes when you run "
        "`clover-agent model pull` again."
    )


def pull(repo_id: str, *, local_dir: Path | None, revision: str | None) -> Path:
    """Download (or finish downloading) ``repo_id``; errors become one clear message."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    try:
        path = snapshot_download(repo_id=repo_id, revision=revision, local_dir=local_dir)
    except LocalEntryNotFoundError as exc:
        cause = exc.__cause__
        if isinstance(cause, OfflineModeIsEnabled) or constants.HF_HUB_OFFLINE:
            raise ModelUnavailable(
                f"cannot download {repo_id}: HF_HUB_OFFLINE is set, so the Hugging Face Hub is not contacted "
                "(unset it, or pass --model DIR with a downloaded copy)"
            ) from exc
        reason = f"{type(cause).__name__}: {cause}" if cause else str(exc).splitlines()[0]
        raise _unreachable(endpoint, reason) from exc
    except GatedRepoError as exc:
        raise ModelUnavailable(
            f"{repo_id} needs accepted terms or a login on the Hub: log in with `hf auth login` "
            "(or set HF_TOKEN) and run again"
        ) from exc
    except RevisionNotFoundError as exc:
        raise UsageError(f"{repo_id} has no revision {revision!r} on {endpoint}") from exc
    except RepositoryNotFoundError as exc:
        raise ModelUnavailable(f"{endpoint} has no repository {repo_id} (or it is private to you)") from exc
    except HfHubHTTPError as exc:
        raise ModelUnavailable(f"the Hub at {endpoint} refused the download of {repo_id}: {exc}") from exc
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in _NETWORK_MODULES:
            raise _unreachable(endpoint, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(exc, OSError):
            where = local_dir or "the Hugging Face cache"
            raise CloverError(f"cannot write the download to {where}: {exc}") from exc
        raise
    return Path(path)


def _pull(args: argparse.Namespace) -> int:
    where = args.dir or "the Hugging Face cache (found automatically later)"
    print(
        f"Downloading {HF_REPO_ID} (about 69 GB) to {where}; an interrupted download resumes on the next run."
    )
    path = pull(HF_REPO_ID, local_dir=args.dir, revision=args.revision)
    print(f"Done: {path}")
    print(f"Check it with: clover-agent model info {path}")
    return ExitCode.OK


# ---- info ------------------------------------------------------------------------------------
def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def _human_count(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if n < 1000 or unit == "B":
            return f"{n:.0f}" if unit == "" else f"{n:.2f}{unit}"
        n /= 1000
    return f"{n:.2f}B"


def _token_label(tokenizer: Any, token_id: int | None) -> str:
    if token_id is None:
        return "none"
    name = tokenizer.id_to_token(token_id) if tokenizer is not None else None
    return f"{token_id} ({name})" if name else str(token_id)


def describe_checkpoint(model_dir: Path) -> dict[str, Any]:
    """Everything ``model info`` shows, as plain data (config, tensor headers, tokenizer, machine)."""
    from clover_agent.backends.engine import serving_device
    from clover_agent.engine.loading.locate import ModelSources
    from clover_agent.engine.loading.readiness import check_engine
    from clover_agent.engine.loading.weights import plan_load, read_tensor_index
    from clover_agent.engine.model.config import CloverConfig
    from clover_agent.engine.text.tokenizer import load_tokenizer

    if model_dir.is_file():
        raise ModelUnavailable(
            f"{model_dir} is a file: give the checkpoint folder (config.json + *.safetensors)"
        )
    if not model_dir.is_dir():
        raise ModelUnavailable(f"{model_dir}: checkpoint folder not found")
    config = CloverConfig.from_file(model_dir / "config.json")
    raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    entries = read_tensor_index(model_dir)
    plan = plan_load(entries)
    tokenizer = load_tokenizer(model_dir)

    by_dtype: dict[str, dict[str, int]] = {}
    for entry in entries:
        slot = by_dtype.setdefault(_DTYPE_NAMES.get(entry.dtype, entry.dtype), {"parameters": 0, "bytes": 0})
        slot["parameters"] += entry.numel
        slot["bytes"] += entry.nbytes
    extra = sorted(name for name, target in plan.targets.items() if ".bidirectional." in target.param)
    layer_counts = Counter(config.layer_types)
    readiness = check_engine(ModelSources(explicit=model_dir))
    gpu = readiness.gpu
    # The engine backend's own rule (`fix --model DIR`), so the verdict matches what fix does.
    device = serving_device(readiness)
    return {
        "path": str(model_dir),
        "architecture": (raw.get("architectures") or [None])[0],
        "model_type": config.model_type,
        "layers": {
            "count": config.num_hidden_layers,
            "by_type": dict(layer_counts),
            "types": list(config.layer_types),
        },
        "sizes": {
            "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size,
            "num_experts": config.num_experts,
            "num_experts_per_tok": config.num_experts_per_tok,
            "moe_intermediate_size": config.moe_intermediate_size,
            "shared_expert_intermediate_size": config.shared_expert_intermediate_size,
            "attention_heads": [config.num_attention_heads, config.num_key_value_heads, config.head_dim],
            "gdn_heads": [
                config.linear_num_key_heads,
                config.linear_num_value_heads,
                config.linear_key_head_dim,
                config.linear_value_head_dim,
            ],
            "max_position_embeddings": config.max_position_embeddings,
        },
        "parameters": {
            "count": sum(v["parameters"] for v in by_dtype.values()),
            "bytes": sum(v["bytes"] for v in by_dtype.values()),
            "tensors": len(entries),
            "files": len({e.file for e in entries}),
            "by_dtype": by_dtype,
        },
        "extra_tensors": extra,
        "ignored_tensors": sorted(plan.ignored),
        "unknown_tensors": sorted(e.name for e in plan.unknown),
        "decoding": {
            "mask_token_id": config.mask_token_id,
            "block_size": config.block_size,
            "threshold": config.threshold,
            "eos_token_id": list(config.eos_token_id),
            "bidirectional_gdn": config.bidirectional_gdn or plan.bidirectional,
        },
        "tokenizer": {
            "present": tokenizer is not None,
            "vocab_size": tokenizer.vocab_size if tokenizer is not None else None,
            "chat_template": tokenizer is not None and tokenizer.chat_template is not None,
            "mask_token": _token_label(tokenizer, config.mask_token_id),
            "eos_tokens": [_token_label(tokenizer, t) for t in config.eos_token_id],
        },
        "machine": {
            "gpu": gpu.name if gpu.available else None,
            "gpu_memory_bytes": gpu.total_bytes,
            "checkpoint_bytes": readiness.weights_bytes,
            "can_serve": device is not None,
            "device": device,
            "problems": [] if device is not None else list(readiness.problems),
        },
    }


def format_description(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`describe_checkpoint`."""
    sizes, params, dec, tok, machine = (
        info["sizes"],
        info["parameters"],
        info["decoding"],
        info["tokenizer"],
        info["machine"],
    )
    by_type = ", ".join(f"{n} {kind}" for kind, n in info["layers"]["by_type"].items())
    heads, gdn = sizes["attention_heads"], sizes["gdn_heads"]
    lines = [
        f"checkpoint:    {info['path']}",
        f"architecture:  {info['architecture'] or '(not given)'} (model_type {info['model_type']})",
        f"layers:        {info['layers']['count']} ({by_type})",
        f"               linear_attention = Gated DeltaNet ({gdn[0]} key / {gdn[1]} value heads, dims {gdn[2]}/{gdn[3]}); "
        f"full_attention = gated attention ({heads[0]} query / {heads[1]} kv heads, dim {heads[2]})",
        f"mixture:       {sizes['num_experts']} experts, top-{sizes['num_experts_per_tok']}, "
        f"intermediate {sizes['moe_intermediate_size']}; shared expert {sizes['shared_expert_intermediate_size']}",
        f"sizes:         hidden {sizes['hidden_size']}, vocabulary {sizes['vocab_size']}, "
        f"context {sizes['max_position_embeddings']}",
        f"parameters:    {_human_count(params['count'])} ({params['count']}) in {params['tensors']} tensors, "
        f"{params['files']} file(s), {_human_bytes(params['bytes'])}",
    ]
    for dtype, slot in sorted(info["parameters"]["by_dtype"].items()):
        lines.append(
            f"  {dtype:<12} {_human_count(slot['parameters'])} parameters, {_human_bytes(slot['bytes'])}"
        )
    extra = info["extra_tensors"]
    layers = sorted({int(name.split(".layers.")[1].split(".")[0]) for name in extra})
    lines.append(
        f"extra tensors: {len(extra)} bidirectional GDN tensors in {len(layers)} layer(s)"
        if extra
        else "extra tensors: none"
    )
    if info["ignored_tensors"]:
        lines.append(
            f"skipped:       {len(info['ignored_tensors'])} tensors of parts the engine does not run"
        )
    if info["unknown_tensors"]:
        lines.append(
            f"UNKNOWN:       {len(info['unknown_tensors'])} tensors the engine cannot place (it will refuse to load):"
        )
        lines += [f"  {name}" for name in info["unknown_tensors"][:20]]
    lines += [
        f"decoding:      mask {tok['mask_token']}, block size {dec['block_size']}, threshold {dec['threshold']}, "
        f"eos {', '.join(tok['eos_tokens']) or 'none'}, bidirectional GDN {'yes' if dec['bidirectional_gdn'] else 'no'}",
        "tokenizer:     "
        + (
            f"yes ({tok['vocab_size']} tokens), chat template {'yes' if tok['chat_template'] else 'no'}"
            if tok["present"]
            else "no (id-level use only)"
        ),
    ]
    if machine["device"] == "cuda":
        lines.append(
            f"this machine:  can serve it ({machine['gpu']}, {machine['gpu_memory_bytes'] / 1024**3:.1f} GiB)"
        )
    elif machine["device"] == "cpu":
        lines.append("this machine:  can serve it on the CPU (small enough; no CUDA GPU here)")
    else:
        lines.append("this machine:  cannot serve it: " + "; ".join(machine["problems"]))
    return "\n".join(lines)


def _info(args: argparse.Namespace) -> int:
    info = describe_checkpoint(Path(args.dir).expanduser())
    print(json.dumps(info, indent=2) if args.json else format_description(info))
    return ExitCode.FAILURE if info["unknown_tensors"] else ExitCode.OK


def _usage(parser: argparse.ArgumentParser):
    """``clover-agent model`` without an action: its help, exit code 2."""

    def show(_args: argparse.Namespace) -> int:
        parser.print_help()
        return ExitCode.USAGE

    return show


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "model",
        help="download the Clover weights or describe a checkpoint",
        description="Manage Clover checkpoints: `pull` downloads the weights, `info` describes a folder.",
    )
    p.set_defaults(func=_usage(p))
    actions = p.add_subparsers(dest="model_command", metavar="ACTION")
    pull_parser = actions.add_parser(
        "pull",
        help=f"download {HF_REPO_ID} with huggingface_hub (resumable)",
        description=f"Download {HF_REPO_ID} (about 69 GB). Without --dir it goes to the Hugging Face "
        "cache, where the engine finds it by itself. Exit 3 when the Hub cannot be reached.",
    )
    pull_parser.add_argument("--dir", type=Path, metavar="DIR", help="download into this folder instead")
    pull_parser.add_argument("--revision", metavar="R", help="branch, tag or commit (default: main)")
    pull_parser.set_defaults(func=_pull)
    info_parser = actions.add_parser(
        "info",
        help="describe a checkpoint folder without loading it",
        description="Print what the engine sees in a checkpoint folder: architecture, layer types, "
        "parameter count and bytes per dtype (from the safetensors headers), extra bidirectional "
        "tensors, decoding contract, tokenizer, and whether this machine can serve it. "
        "Exit 1 when the folder holds tensors the engine cannot place, 3 when it is not a checkpoint.",
    )
    info_parser.add_argument("dir", metavar="DIR", help="checkpoint folder (config.json + *.safetensors)")
    info_parser.add_argument("--json", action="store_true", help="print the description as JSON")
    info_parser.set_defaults(func=_info)
