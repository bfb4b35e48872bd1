"""Loading safetensors checkpoints into a :class:`CloverModel`.

Handles the layouts Hugging Face checkpoints of this architecture come in: one file or shards with
``model.safetensors.index.json``; ``model.`` or ``model.language_model.`` prefixes; routed experts
per expert (``mlp.experts.{e}.gate_proj.weight`` …) or fused (``mlp.experts.gate_up_proj``,
``mlp.experts.down_proj``), kept dense or quantised (``experts=``, docs/quantization.md), on the
device or in host memory (``experts_on=``); Clover's bidirectional GDN tensors; FP8 weights with
their ``weight_scale_inv``. Vision and multi-token-prediction tensors are skipped and listed.
Anything else that does not fit is an error naming the tensor and its file, as are missing tensors,
shape or dtype mismatches and unreadable files. Tensors are read one at a time (``safe_open``) and
copied straight into the model's parameters, so host memory holds about one tensor beyond the model.
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

from clover_agent.engine.errors import CheckpointError, EngineArgumentError
from clover_agent.engine.loading.readiness import EXPERT_CHOICES, EXPERT_PLACES
from clover_agent.engine.model import quantized as quant
from clover_agent.engine.model.bidirectional_gdn import CHECKPOINT_TENSORS as BIDIRECTIONAL_TENSORS
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.moe import SparseMoe
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.model.quantized import QuantizedRoutedExperts
from clover_agent.engine.ops import KernelChoice

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
MODEL_PREFIXES = ("model.language_model.", "model.")
#: Tensors of parts the engine does not run (vision tower, multi-token prediction head).
IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")

_PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
#: How the routed experts are kept: as the checkpoint stores them ("auto": FP8 for an FP8 checkpoint,
#: else dense in the model's dtype), dense, or quantised on load.
SCALE_SUFFIX = "_scale_inv"  # "x.weight" is scaled by "x.weight_scale_inv"
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
#: Stored weight dtypes that need their ``weight_scale_inv`` to mean anything.
_SCALED_DTYPES = {"F8_E4M3": torch.float8_e4m3fn}


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
    #: Weight name -> its ``weight_scale_inv`` entry (FP8 checkpoints).
    scales: dict[str, TensorEntry] = field(default_factory=dict)

    @property
    def load_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries if e.name in self.targets)

    @property
    def fp8(self) -> bool:
        return any(e.dtype in _SCALED_DTYPES for e in self.entries if e.name in self.targets)


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
        if name.endswith(".weight" + SCALE_SUFFIX):
            plan.scales[name.removesuffix(SCALE_SUFFIX)] = entry
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
    names = {e.name for e in entries}
    for weight, scale in list(plan.scales.items()):
        if weight not in names:
            plan.unknown.append(scale)
            del plan.scales[weight]
        elif weight.startswith(IGNORED_PREFIXES):
            plan.ignored.append(scale.name)
            del plan.scales[weight]
    return plan


class LoadProgress:
    """Tensors and bytes done, rate and ETA on stderr (nothing when quiet): one line refreshed in
    place on a terminal; to anything else (a log file, a service's journal, CI) a whole line every
    :data:`LOG_EVERY_S` seconds and the last, rather than carriage returns that pile up on one line."""

    #: Seconds between lines when the stream is not a terminal (a terminal's line is redrawn twice a second).
    LOG_EVERY_S = 10.0

    def __init__(self, total_tensors: int, total_bytes: int, stream: TextIO | None) -> None:
        self.total_tensors, self.total_bytes, self.stream = total_tensors, total_bytes, stream
        self.tensors = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = self.started
        self.interactive = _is_terminal(stream)

    def advance(self, nbytes: int) -> None:
        self.tensors += 1
        self.bytes += nbytes
        now = time.monotonic()
        last = self.tensors == self.total_tensors
        every = 0.5 if self.interactive else self.LOG_EVERY_S
        if self.stream is None or not (last or now - self._shown >= every or self.tensors == 1):
            return
        self._shown = now
        if self.interactive:
            self.stream.write("\r" + self.line(now) + ("\n" if last else ""))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.bytes / elapsed
        left = (self.total_bytes - self.bytes) / rate if rate > 0 else float("inf")
        return (
            f"loading weights: {self.tensors}/{self.total_tensors} tensors, "
            f"{_human(self.bytes)}/{_human(self.total_bytes)}, {_human(rate)}/s, ETA {left:.0f}s"
        )


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a stream without isatty, or a closed one
        return False


def _human(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{nbytes:.0f} B"
        nbytes /= 1000
    return f"{nbytes:.1f} GB"


def memory_plan(
    plan: LoadPlan, model_bytes: int, device: torch.device, dtype: torch.dtype, host_bytes: int = 0
) -> list[str]:
    """Lines describing what the load will take, shown before it starts (``model_bytes`` on
    ``device``, ``host_bytes`` of routed experts in host memory)."""
    files = sorted({e.file for e in plan.entries})
    largest = max((e.nbytes for e in plan.entries if e.name in plan.targets), default=0)
    lines = [
        f"checkpoint: {len(plan.targets)} tensors, {_human(plan.load_bytes)} in {len(files)} file(s)",
        f"model: {_human(model_bytes)} of parameters as {str(dtype).removeprefix('torch.')} on {device}",
    ]
    if host_bytes:
        pinned = " (pinned)" if device.type == "cuda" else ""
        lines.append(
            f"routed experts: {_human(host_bytes)} in host memory{pinned}, computed there by the CPU"
        )
    lines.append(f"host memory beyond the model: about one tensor at a time (largest {_human(largest)})")
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
    experts: str = "auto",
    int4_group: int = quant.INT4_GROUP,
    experts_on: str = "device",
) -> tuple[CloverModel, CloverConfig]:
    """Build the model from ``model_dir`` and load its weights, shard by shard, onto ``device``.

    ``experts``: how the routed experts are kept (:data:`EXPERT_CHOICES`): ``"auto"`` as stored
    (an FP8 checkpoint's stay FP8, with its block scales), ``"dense"`` in ``dtype``, ``"fp8"`` or
    ``"int4"`` (groups of ``int4_group`` inputs) quantised while loading, one tensor at a time.
    ``experts_on``: where the routed experts go (:data:`EXPERT_PLACES`): ``"device"`` with the rest,
    or ``"host"``: allocated in host memory (pinned when ``device`` is CUDA), everything else on
    ``device``, and computed there by the CPU (``SparseMoe.host_forward``).
    ``progress=None`` is quiet. Raises :class:`CheckpointError` for anything wrong with the folder.
    """
    model_dir = Path(model_dir)
    if experts not in EXPERT_CHOICES:
        raise EngineArgumentError(
            f"unknown experts choice {experts!r} (choose from {', '.join(EXPERT_CHOICES)})"
        )
    if experts_on not in EXPERT_PLACES:
        raise EngineArgumentError(
            f"unknown experts_on choice {experts_on!r} (choose from {', '.join(EXPERT_PLACES)})"
        )
    if int4_group < 16 or int4_group & (int4_group - 1):
        raise EngineArgumentError(f"int4_group must be a power of two of at least 16, not {int4_group}")
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: checkpoint folder not found")
    device = torch.device(device)
    config = CloverConfig.from_file(model_dir / "config.json")
    plan = plan_load(read_tensor_index(model_dir))
    fp8_block = fp8_block_of(model_dir)
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

    scheme = {"auto": "fp8" if plan.fp8 else None, "dense": None}.get(experts, experts)
    block = (fp8_block if plan.fp8 else quant.FP8_BLOCK) if scheme == "fp8" else (1, int4_group)
    with torch.device("meta"):
        model = CloverModel(config, kernels=kernels).to(dtype)
        moes = [moe for moe in model.modules() if isinstance(moe, SparseMoe)]
        if scheme is not None:  # before any allocation: the dense experts never exist
            for moe in moes:
                moe.experts = QuantizedRoutedExperts(config, scheme, block, device=torch.device("meta"))
    if experts_on == "host":  # taken out while the rest is allocated on the device: never there
        routed = [(moe, moe.experts) for moe in moes]
        for moe, _ in routed:
            del moe.experts
    model = model.to_empty(device=device)  # the only allocation: parameters in the target dtype
    host_bytes = 0
    if experts_on == "host":
        for moe, module in routed:
            host_bytes += _allocate_on_host(module, pin=device.type == "cuda")
            moe.experts = module
            moe.experts_on = "host"
    model.ops  # noqa: B018 - resolve the kernels for this device now: a bad choice fails before loading
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters(remove_duplicate=False))
    quantized = {
        f"{name}.{weight}": (module, weight)
        for name, module in model.named_modules()
        if isinstance(module, QuantizedRoutedExperts)
        for weight in ("gate_up_proj", "down_proj")
    }
    # the quantised experts' logical shapes, for the checks
    shapes = {
        **params,
        **{k: torch.empty(m.weight(w).shape, device="meta") for k, (m, w) in quantized.items()},
    }
    unknown = plan.unknown + [
        e for e in plan.entries if e.name in plan.targets and plan.targets[e.name].param not in shapes
    ]
    if unknown:
        raise CheckpointError(
            f"{model_dir}: checkpoint tensors that do not fit the model layout:\n"
            + "\n".join(f"  {e.name} ({e.file.name}, shape {list(e.shape)})" for e in unknown)
        )
    _check_targets(plan, shapes, config, model_dir, fp8_block)

    if plan.ignored:
        logger.info(
            "skipped checkpoint tensors (vision / multi-token prediction): %s", ", ".join(plan.ignored)
        )
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model_bytes += sum(m.nbytes for m in {m for m, _ in quantized.values()})
    model_bytes -= host_bytes
    if progress is not None:
        for line in memory_plan(plan, model_bytes, device, dtype, host_bytes):
            progress.write(line + "\n")
        if scheme is not None:
            progress.write(f"routed experts: {scheme}, scales per {block[0]} x {block[1]} block\n")
    meter = LoadProgress(len(plan.targets), plan.load_bytes, progress)
    by_file: dict[Path, list[TensorEntry]] = {}
    for entry in plan.entries:
        if entry.name in plan.targets:
            by_file.setdefault(entry.file, []).append(entry)
    writer = _Writer(plan, params, quantized, fp8_block)
    for path, entries in by_file.items():
        writer.load_file(path, entries, meter.advance)
    model.fuse_projections()
    model.eval()
    return model, config


def _allocate_on_host(module: torch.nn.Module, *, pin: bool) -> int:
    """``module``'s own parameters and buffers (meta tensors) allocated empty in host memory, page
    locked when ``pin`` (the copies to a CUDA device then run at full speed); returns their bytes."""
    total = 0
    for name, param in list(module.named_parameters(recurse=False)):
        empty = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=pin)
        setattr(module, name, torch.nn.Parameter(empty, requires_grad=param.requires_grad))
        total += empty.numel() * empty.element_size()
    for name, buffer in list(module.named_buffers(recurse=False)):
        empty = torch.empty(buffer.shape, dtype=buffer.dtype, device="cpu", pin_memory=pin)
        setattr(module, name, empty)
        total += empty.numel() * empty.element_size()
    return total


def fp8_block_of(model_dir: Path) -> tuple[int, int]:
    """The FP8 scale block of ``config.json``'s ``quantization_config`` (``weight_block_size``), if any."""
    try:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return quant.FP8_BLOCK  # CloverConfig.from_file reports the problem
    found = raw.get("quantization_config") or raw.get("text_config", {}).get("quantization_config") or {}
    size = found.get("weight_block_size") or quant.FP8_BLOCK
    return int(size[0]), int(size[1])


def _check_targets(
    plan: LoadPlan,
    params: dict[str, torch.Tensor],
    config: CloverConfig,
    model_dir: Path,
    fp8_block: tuple[int, int],
) -> None:
    """Every parameter covered exactly, every tensor of the right shape and a float dtype (FP8 with
    its ``weight_scale_inv`` of one scale per ``fp8_block``)."""
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
        scale = plan.scales.get(name)
        if entry.dtype in _SCALED_DTYPES and scale is None:
            problems.append(f"{where}: {entry.dtype} weight without its {name}{SCALE_SUFFIX}")
        elif entry.dtype not in _DTYPES and entry.dtype not in _SCALED_DTYPES:
            problems.append(f"{where}: dtype {entry.dtype} is not a floating-point weight type")
        if scale is not None:
            grid = (
                quant.scale_grid(entry.shape[-2], entry.shape[-1], fp8_block)
                if len(entry.shape) >= 2
                else None
            )
            if grid is None or scale.shape != (*entry.shape[:-2], *grid) or scale.dtype not in _DTYPES:
                problems.append(
                    f"{scale.name} ({scale.file.name}): {scale.dtype} {list(scale.shape)}, expected one "
                    f"float per {fp8_block[0]} x {fp8_block[1]} block of {list(entry.shape)}"
                )
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
        missing: list[int | None]
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


class _Writer:
    """Copies checkpoint tensors into the model: dense parameters (FP8 ones dequantised) and the
    quantised experts' buffers (stored FP8 bytes as they are, anything else quantised here)."""

    def __init__(
        self,
        plan: LoadPlan,
        params: dict[str, torch.nn.Parameter],
        quantized: dict[str, tuple[QuantizedRoutedExperts, str]],
        fp8_block: tuple[int, int],
    ) -> None:
        self.plan, self.params, self.quantized, self.fp8_block = plan, params, quantized, fp8_block

    def load_file(self, path: Path, entries: list[TensorEntry], advance: Callable[[int], None]) -> None:
        """``entries`` of the shard ``path``, then the shard is closed: an open one keeps the pages
        read from it resident, and all of them open at once held the whole checkpoint in memory
        (tests/engine/test_weights_memory.py). A scale in another shard is read from it alone."""
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for entry in entries:
                    tensor = handle.get_tensor(entry.name)
                    scale_entry = self.plan.scales.get(entry.name)
                    scale = None
                    if scale_entry is not None and scale_entry.file == path:
                        scale = handle.get_tensor(scale_entry.name)
                    elif scale_entry is not None:
                        with safe_open(str(scale_entry.file), framework="pt", device="cpu") as other:
                            scale = other.get_tensor(scale_entry.name)
                    self.store(self.plan.targets[entry.name], tensor, scale)
                    advance(entry.nbytes)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: reading the tensors failed ({exc})") from exc

    def store(self, target: Target, tensor: torch.Tensor, scale: torch.Tensor | None) -> None:
        if target.param in self.quantized:
            self.store_quantized(target, tensor, scale)
            return
        param = self.params[target.param]
        if scale is not None:
            tensor = quant.dequantize_fp8(tensor, scale, self.fp8_block, param.dtype)
        destination = param.data if target.expert is None else param.data[target.expert]
        if target.half is not None:
            rows = param.shape[1] // 2
            destination = destination[target.half * rows : (target.half + 1) * rows]
        destination.copy_(tensor.to(param.dtype))

    def store_quantized(self, target: Target, tensor: torch.Tensor, scale: torch.Tensor | None) -> None:
        module, name = self.quantized[target.param]
        module.store(name, target.expert, target.half, tensor, scale, self.fp8_block)
