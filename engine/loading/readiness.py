"""Can the embedded engine serve Clover on this machine? (GPU, memory, weights)

Used by ``clover-agent doctor`` and before any command that would load the full model, so a
machine that cannot serve says so within seconds instead of failing half-way through loading the
weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.engine.loading.locate import ModelLocation, ModelSources, locate_model

GiB = 1024**3
#: Clover-35B-A3B in bf16 (weights only), used when the checkpoint's own size is unknown.
FULL_MODEL_BYTES = 69 * 10**9
#: Room for caches, activations and the CUDA context on top of the weights.
HEADROOM_BYTES = 6 * GiB
#: How the loader may hold the routed experts (``load_model``'s ``experts=``): as stored, dense in the
#: model's dtype, or quantised while loading (``kernels.moe.quant.SCHEMES``). Here, not in the loader,
#: so that the front ends check a choice without importing torch.
EXPERT_CHOICES: tuple[str, ...] = ("auto", "dense", "fp8", "int4")
#: Where the loader puts the routed experts (``load_model``'s ``experts_on=``): on the model's device,
#: or in host memory, computed there by the CPU (docs/serving.md, "Routed experts in host memory").
EXPERT_PLACES: tuple[str, ...] = ("device", "host")


@dataclass
class GpuInfo:
    available: bool
    name: str | None = None
    total_bytes: int = 0
    reason: str = ""


@dataclass
class EngineReadiness:
    gpu: GpuInfo
    model: ModelLocation
    weights_bytes: int | None
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        """The message shown when the engine cannot serve: what is missing and the ways forward."""
        lines = ["The embedded Clover engine cannot run on this machine:"]
        lines += [f"  - {p}" for p in self.problems]
        if self.model.path is None:
            lines.append("Looked for the weights in:")
            lines.append(self.model.describe())
        lines += [
            "Ways forward:",
            "  1. On a machine with a CUDA GPU, get the weights with `clover-agent model pull`",
            "     (or pass --model DIR / set CLOVER_MODEL to a downloaded copy), then run again. An 80 GB",
            "     card holds them as shipped; CLOVER_EXPERTS=int4 fits a 24 GB one (`clover-agent doctor",
            "     --plan --card-gib N --experts int4` plans for a card).",
            "  2. Use a Clover server elsewhere: `clover-agent serve` on the GPU box, then here",
            "     clover-agent fix ... --backend openai --base-url http://HOST:8000/v1",
        ]
        return "\n".join(lines)


def probe_gpu() -> GpuInfo:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return GpuInfo(False, reason=f"torch is not installed ({exc})")
    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = "torch has no CUDA support (CPU build)" if built is None else "no CUDA device is visible"
        return GpuInfo(False, reason=why)
    props = torch.cuda.get_device_properties(0)
    return GpuInfo(True, name=props.name, total_bytes=int(props.total_memory))


def checkpoint_bytes(model_dir: Path) -> int:
    """Bytes of the tensors in a checkpoint folder, from the index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(size, int):
            return size
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def check_engine(
    sources: ModelSources,
    *,
    held: Callable[[Path], int | None] | None = None,
    gpu: GpuInfo | None = None,
) -> EngineReadiness:
    """The GPU (``gpu``: this machine's unless given), the weights found in ``sources`` and whether
    they fit. ``held``: the bytes the weights take once loaded (default: the files' size, as stored;
    ``memory_plan.loaded_weight_bytes`` for routed experts loaded in another format)."""
    gpu = gpu if gpu is not None else probe_gpu()
    model = locate_model(sources)
    weights = (held or checkpoint_bytes)(model.path) if model.path else None
    report = EngineReadiness(gpu=gpu, model=model, weights_bytes=weights)
    need = (weights or FULL_MODEL_BYTES) + HEADROOM_BYTES
    if not gpu.available:
        report.problems.append(f"no CUDA GPU: {gpu.reason}")
    elif gpu.total_bytes < need:
        report.problems.append(
            f"GPU {gpu.name} has {gpu.total_bytes / GiB:.1f} GiB; the model needs about {need / GiB:.1f} GiB"
        )
    if model.path is None:
        report.problems.append("no Clover weights found")
    return report
