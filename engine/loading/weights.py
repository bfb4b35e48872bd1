"""Loading safetensors checkpoints into a :class:`CloverModel`.

Handles the layouts Hugging Face checkpoints of this architecture come in: one file or shards with
``model.safetensors.index.json``; ``model.`` or ``model.language_model.`` prefixes; routed experts
per expert (``mlp.experts.{e}.gate_proj.weight`` …) or fused (``mlp.experts.gate_up_proj``,
``mlp.experts.down_proj``); Clover's bidirectional GDN tensors. Vision and multi-token-prediction
tensors are skipped and listed. Anything else that does not fit is an error naming the tensor and
its file, as are missing tensors, shape or dtype mismatches and unreadable files.

Tensors are read one at a time (``safe_open``), converted and copied straight into the model's
parameters on the target device, so host memory holds about one tensor beyond the model itself.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import torch
from safetensors import SafetensorError, safe_open

from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.model.bidirectional_gdn import CHECKPOINT_TENSORS as BIDIRECTIONAL_TENSORS
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.ops import KernelChoice

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
MODEL_PREFIXES = ("model.language_model.", "model.")
#: Tensors of parts the engine does not run (vision tower, multi-token prediction head).
IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")

_PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_BIDIRECTIONAL = re.compile(
    r"^(layers\.\d+\.linear_attn)\.(" + "|".join(map(re.escape, BIDIRECTIONAL_TENSORS)) + ")$"
)

#: Bytes of one element per safetensors dtype code.
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
}

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the checkpoint as its header describes it."""

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype code, e.g. "BF16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 1)


@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a model parameter, or part of one (an expert's slice)."""

    param: str
    expert: int | None = None  # index into the fused experts tensor
    half: int | None = None  # 0: gate rows, 1: up rows of the expert's gate_up_proj


@dataclass
class LoadPlan:
    """Every checkpoint tensor sorted into loaded (with its target), ignored, or unknown."""

    entries: list[TensorEntry]
    targets: dict[str, Target] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    unknown: list[TensorEntry] = field(default_factory=list)
    bidirectional: bool = False

    @property
    def load_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries if e.name in self.targets)


def read_tensor_index(model_dir: Path) -> list[TensorEntry]:
    """Every tensor of the checkpoint (headers only). Errors name the file at fault."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({exc})") from exc
        files = sorted({model_dir / name for name in weight_map.values()})
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(
                f"{index_path}: shard file(s) missing from {model_dir}: {', '.join(absent)}"
            )
    else:
        weight_map = None
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{model_dir}: no *.safetensors files (and no {INDEX_FILE})")

    entries: list[TensorEntry] = []
    seen: dict[str, Path] = {}
    for path in files:
        for name, shape, dtype in _read_header(path):
            if name in seen:
                raise CheckpointError(f"tensor {name} appears in both {seen[name]} and {path}")
            seen[name] = path
            entries.append(TensorEntry(name, path, shape, dtype))
    if weight_map is not None:
        listed_missing = sorted(n for n, f in weight_map.items() if seen.get(n) != model_dir / f)
        if listed_missing:
            raise CheckpointError(
                f"{index_path}: tensors listed but not found in the named shard: {', '.join(listed_missing[:10])}"
                + (" …" if len(listed_missing) > 10 else "")
            )
    return entries


def _read_header(path: Path) -> Iterable[tuple[str, tuple[int, ...], str]]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names = list(handle.keys())
            return [
                (n, tuple(handle.get_slice(n).get_shape()), handle.get_slice(n).get_dtype()) for n in names
            ]
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


def plan_load(entries: list[TensorEntry]) -> LoadPlan:
    """Map checkpoint names to model parameters (prefixes, per-expert slices, bidirectional tensors)."""
    plan = LoadPlan(entries=entries)
    for entry in entries:
        name = entry.name
        if name.startswith(IGNORED_PREFIXES):
            plan.ignored.append(name)
            continue
        if name == "lm_head.weight":
            plan.targets[name] = Target("lm_head.weight")
            continue
        prefix = next((p for p in MODEL_PREFIXES if name.startswith(p)), None)
        if prefix is None:
            plan.unknown.append(entry)
            continue
        local = name[len(prefix) :]
        if match := _PER_EXPERT.match(local):
            experts, index, proj = match.group(1), int(match.group(2)), match.group(3)
            param = f"{experts}.down_proj" if proj == "down_proj" else f"{experts}.gate_up_proj"
            half = {"gate_proj": 0, "up_proj": 1}.get(proj)
            plan.targets[name] = Target(param, expert=index, half=half)
        elif match := _BIDIRECTIONAL.match(local):
            plan.targets[name] = Target(f"{match.group(1)}.bidirectional.{match.group(2)}")
            plan.bidirectional = True
        else:
            plan.targets[name] = Target(local)
    return plan


class LoadProgress:
    """Tensors and bytes done, rate and ETA on one refreshed stderr line (nothing when quiet)."""

    def __init__(self, total_tensors: int, total_bytes: int, stream: TextIO | None) -> None:
        self.total_tensors, self.total_bytes, self.stream = total_tensors, total_bytes, stream
        self.tensors = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0

    def advance(self, nbytes: int) -> None:
        self.tensors += 1
        self.bytes += nbytes
        now = time.monotonic()
        if self.stream is not None and (now - self._shown >= 0.5 or self.tensors == self.total_tensors):
            self._shown = now
            self.stream.write("\r" + self.line(now))
            if self.tensors == self.total_tensors:
                self.stream.write("\n")
            self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.bytes / elapsed
        left = (self.total_bytes - self.bytes) / rate if rate > 0 else float("inf")
        return (
            f"loading weights: {self.tensors}/{self.total_tensors} tensors, "
            f"{_human(self.bytes)}/{_human(self.total_bytes)}, {_human(rate)}/s, ETA {left:.0f}s"
        )


def _human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{nbytes:.0f} B"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def memory_plan(plan: LoadPlan, model_bytes: int, device: torch.device, dtype: torch.dtype) -> list[str]:
    """Lines describing what the load will take, shown before it starts."""
    files = sorted({e.file for e in plan.entries})
    largest = max((e.nbytes for e in plan.entries if e.name in plan.targets), default=0)
    lines = [
        f"checkpoint: {len(plan.targets)} tensors, {_human(plan.load_bytes)} in {len(files)} file(s)",
        f"model: {_human(model_bytes)} of parameters as {str(dtype).removeprefix('torch.')} on {device}",
        f"host memory beyond the model: about one tensor at a time (largest {_human(largest)})",
    ]
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        lines.append(f"{device}: {_human(free)} free of {_human(total)}")
        if model_bytes > free:
            lines.append(
                f"warning: the parameters need {_human(model_bytes)} but only {_human(free)} is free"
            )
    if plan.ignored:
        groups: dict[str, int] = {}
        for name in plan.ignored:
            group = next((p + "*" for p in IGNORED_PREFIXES if name.startswith(p)), name)
            groups[group] = groups.get(group, 0) + 1
        summary = ", ".join(f"{group} ({count})" for group, count in sorted(groups.items()))
        lines.append(f"skipping {len(plan.ignored)} tensor(s) the engine does not use: {summary}")
    if plan.bidirectional:
        lines.append("bidirectional GDN tensors found: in-block backward branch enabled")
    return lines


def load_model(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    kernels: KernelChoice = "auto",
    progress: TextIO | None = sys.stderr,
) -> tuple[CloverModel, CloverConfig]:
    """Build the model from ``model_dir`` and load its weights, shard by shard, onto ``device``.

    ``progress=None`` is quiet. Raises :class:`CheckpointError` for anything wrong with the folder.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: checkpoint folder not found")
    device = torch.device(device)
    config = CloverConfig.from_file(model_dir / "config.json")
    plan = plan_load(read_tensor_index(model_dir))
    if plan.bidirectional and not config.bidirectional_gdn:
        # Tensors without the config flag: bidirectional, with the kernel size the tensors have.
        kernel = next(
            (e.shape[-1] for e in plan.entries if e.name.endswith(".conv1d_right.weight")),
            config.right_conv_kernel_size,
        )
        config = config.with_overrides(bidirectional_gdn=True, right_conv_kernel_size=kernel)

    if config.tie_word_embeddings and "lm_head.weight" in plan.targets:
        # The head is the embedding matrix; a stored copy would silently overwrite it.
        del plan.targets["lm_head.weight"]
        plan.ignored.append("lm_head.weight")

    with torch.device("meta"):
        model = CloverModel(config, kernels=kernels).to(dtype)
    model = model.to_empty(device=device)  # the only allocation: parameters in the target dtype
    model.ops  # noqa: B018 - resolve the kernels for this device now: a bad choice fails before loading
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters(remove_duplicate=False))
    unknown = plan.unknown + [
        e for e in plan.entries if e.name in plan.targets and plan.targets[e.name].param not in params
    ]
    if unknown:
        raise CheckpointError(
            f"{model_dir}: checkpoint tensors that do not fit the model layout:\n"
            + "\n".join(f"  {e.name} ({e.file.name}, shape {list(e.shape)})" for e in unknown)
        )
    _check_targets(plan, params, config, model_dir)

    if plan.ignored:
        logger.info(
            "skipped checkpoint tensors (vision / multi-token prediction): %s", ", ".join(plan.ignored)
        )
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if progress is not None:
        for line in memory_plan(plan, model_bytes, device, dtype):
            progress.write(line + "\n")
    meter = LoadProgress(len(plan.targets), plan.load_bytes, progress)
    by_file: dict[Path, list[TensorEntry]] = {}
    for entry in plan.entries:
        if entry.name in plan.targets:
            by_file.setdefault(entry.file, []).append(entry)
    for path, entries in by_file.items():
        _load_file(path, entries, plan, params, meter.advance)
    model.eval()
    return model, config


def _check_targets(
    plan: LoadPlan, params: dict[str, torch.nn.Parameter], config: CloverConfig, model_dir: Path
) -> None:
    """Every parameter covered exactly, every tensor of the right shape and a float dtype."""
    problems: list[str] = []
    covered: set[tuple[str, int | None, int | None]] = set()
    entries = {e.name: e for e in plan.entries}
    for name, target in plan.targets.items():
        entry = entries[name]
        where = f"{name} ({entry.file.name})"
        param = params[target.param]
        if target.expert is not None and target.expert >= param.shape[0]:
            problems.append(f"{where}: expert {target.expert} does not exist (num_experts={param.shape[0]})")
            continue
        expected = _expected_shape(param, target)
        if entry.shape != expected:
            problems.append(f"{where}: shape {list(entry.shape)}, expected {list(expected)}")
        if entry.dtype not in _DTYPES:
            problems.append(f"{where}: dtype {entry.dtype} is not a floating-point weight type")
        key = (target.param, target.expert, target.half)
        if key in covered:
            problems.append(f"{where}: another tensor already holds these weights")
        covered.add(key)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    per_expert = {key[0] for key in covered if key[1] is not None}
    for pname, param in params.items():
        if pname in tied:
            continue
        if (pname, None, None) in covered:
            if pname in per_expert:
                problems.append(f"{_checkpoint_name(pname, [])}: present both fused and per expert")
            continue
        if pname.endswith("mlp.experts.gate_up_proj"):
            missing = [e for e in range(param.shape[0]) for h in (0, 1) if (pname, e, h) not in covered]
        elif pname.endswith("mlp.experts.down_proj"):
            missing = [e for e in range(param.shape[0]) if (pname, e, None) not in covered]
        else:
            missing = [None]
        if missing:
            problems.append(f"missing tensor for {_checkpoint_name(pname, missing)}")
    if problems:
        shown = problems[:20] + ([f"… and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise CheckpointError(
            f"{model_dir}: the checkpoint does not match its config:\n  " + "\n  ".join(shown)
        )


def _checkpoint_name(param: str, experts: list[int | None]) -> str:
    name = param if param == "lm_head.weight" else "model." + param.replace(".bidirectional.", ".")
    if experts and experts[0] is not None:
        unique = sorted({e for e in experts if e is not None})
        name += f" (experts {unique[:8]}{' …' if len(unique) > 8 else ''}, fused or per expert)"
    return name


def _expected_shape(param: torch.Tensor, target: Target) -> tuple[int, ...]:
    if target.expert is None:
        return tuple(param.shape)
    rows = param.shape[1] // 2 if target.half is not None else param.shape[1]
    return (rows, *param.shape[2:])


def _load_file(
    path: Path,
    entries: list[TensorEntry],
    plan: LoadPlan,
    params: dict[str, torch.nn.Parameter],
    advance: Callable[[int], None],
) -> None:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for entry in entries:
                target = plan.targets[entry.name]
                param = params[target.param]
                tensor = handle.get_tensor(entry.name)
                destination = param.data if target.expert is None else param.data[target.expert]
                if target.half is not None:
                    rows = param.shape[1] // 2
                    destination = destination[target.half * rows : (target.half + 1) * rows]
                destination.copy_(tensor.to(param.dtype))
                advance(entry.nbytes)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: reading the tensors failed ({exc})") from exc
