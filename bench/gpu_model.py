"""The model part of ``gpu_bench.py``: a model of the given shape with random weights built on the
device, its decoding steps timed at a committed context, and the memory floor of each step.

The model is built on the meta device, given uninitialised storage on the target device
(``to_empty``) and filled there with random values: nothing passes through host memory, so the
full Clover shape (~35B parameters, ~70 GB in bf16) builds in seconds on one GPU. The committed
context is random K/V and GDN state as well: a step's work does not depend on those values.

Steps (each timed on rotating token ids, committing steps rewound after each call):

* ``denoise_32``: one denoising pass over a block (block attention, logits for 32 rows);
* ``commit_32``: the block's commit pass (no LM head);
* ``fused_64``: a commit fused with the next block's first denoising pass (64 tokens, 32 logits);
* ``verify_64``: a self-speculative verify (causal, 64 tokens, commits 32, 33 logit rows);
* ``ar_1``: one autoregressive token (causal, commits 1).

The floor of a step is the bytes it must read once (every dense weight of the layers, the routed
experts the step's tokens actually use, the committed K/V and GDN state, the LM head when it
computes logits) over the measured copy bandwidth. :func:`quantize_experts` turns the routed experts
into FP8 or INT4 ones (docs/quantization.md), so the same steps are timed on those kernels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_timing import Budget, median_seconds, synchronize
from torch.utils._python_dispatch import TorchDispatchMode

from clover_agent.engine.decoding.graphs import StepGraphs, StepShape
from clover_agent.engine.model.cache import AttentionKV, GdnState, ModelCache
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.moe import SparseMoe
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.model.quantized import QuantizedRoutedExperts
from clover_agent.kernels.moe.quant import FP8_BLOCK, INT4_GROUP, QuantizedWeight
from clover_agent.kernels.moe.reference import route

#: Token-id sets cycled through while timing a step.
ROTATIONS = 3


@torch.no_grad()
def random_model(
    config: CloverConfig, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> CloverModel:
    """``config``'s model with random weights of sensible scale, allocated and filled on ``device``."""
    with torch.device("meta"):
        model = CloverModel(config).to(dtype)
    model = model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") and ".linear_attn.norm" not in name:
            param.normal_(0.0, 0.02, generator=gen)  # zero-centred norms: scale 1 + weight
        elif ".linear_attn.norm" in name:
            param.normal_(1.0, 0.02, generator=gen)
        elif name.endswith("A_log"):
            param.uniform_(0.0, 2.7, generator=gen)
        elif name.endswith(("dt_bias", "bidir_mix_logits")):
            param.normal_(0.0, 0.5, generator=gen)
        elif name == "embed_tokens.weight":
            param.normal_(0.0, 1.0, generator=gen)
        else:  # projections, convolutions, experts, router: unit-variance outputs
            fan_in = param.shape[-1] if param.dim() > 1 else 1
            param.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
    model.fuse_projections()  # as the loader leaves a checkpoint's model: what the engine runs
    model.eval()
    return model


@torch.no_grad()
def random_context(model: CloverModel, length: int, extra: int, seed: int = 1) -> ModelCache:
    """A cache holding ``length`` committed tokens of random K/V and GDN state, room for ``extra`` more."""
    cache = model.new_cache(length + extra)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for state in cache.layers:
        if isinstance(state, AttentionKV):
            state.key_buffer[:length].normal_(generator=gen)
            state.value_buffer[:length].normal_(generator=gen)
            state.length = length
        else:
            state.recurrent.normal_(0.0, 0.1, generator=gen)
            state.conv.normal_(generator=gen)
    cache.length = length
    return cache


def rewind(cache: ModelCache, length: int, commits: int) -> None:
    """Undo a commit's bookkeeping so the next timed call runs at the same context (the state's
    values drift; the work does not)."""
    cache.length, cache.commits = length, commits
    for state in cache.layers:
        if isinstance(state, AttentionKV):
            state.length = length


STEPS: dict[str, dict[str, Any]] = {
    "denoise_32": {"tokens": 32, "attention": "block", "commit": False, "logit_rows": 32},
    "commit_32": {"tokens": 32, "attention": "block", "commit": True, "logit_rows": 0},
    "fused_64": {"tokens": 64, "attention": "block", "commit": 32, "logit_rows": 32},
    "verify_64": {"tokens": 64, "attention": "causal", "commit": 32, "logit_rows": 33},
    "ar_1": {"tokens": 1, "attention": "causal", "commit": True, "logit_rows": 1},
}


def step_call(model: CloverModel, cache: ModelCache, step: str) -> Callable[[torch.Tensor], Any]:
    spec = STEPS[step]
    length, commits = cache.length, cache.commits

    def call(ids: torch.Tensor) -> Any:
        out = model(
            ids, cache, attention=spec["attention"], commit=spec["commit"], logit_rows=spec["logit_rows"]
        )
        if spec["commit"]:
            rewind(cache, length, commits)
        return out

    return call


def step_ids(model: CloverModel, step: str, seed: int) -> torch.Tensor:
    """Token ids of a step: ordinary tokens, the mask token where a denoising pass has masks."""
    config, tokens = model.config, STEPS[step]["tokens"]
    gen = torch.Generator(device=model.device).manual_seed(seed)
    ids = torch.randint(10, min(config.vocab_size, 150_000), (tokens,), generator=gen, device=model.device)
    if config.mask_token_id is not None and step in ("denoise_32", "fused_64"):
        ids[-32:] = config.mask_token_id
    return ids


class _OpCounter(TorchDispatchMode):
    """Counts the ATen operators a region dispatches (about one kernel launch each on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def operators_per_call(call: Callable[[torch.Tensor], Any], ids: torch.Tensor) -> int:
    with _OpCounter() as counter:
        call(ids)
    return counter.count


def cuda_kernels_per_call(call: Callable[[torch.Tensor], Any], ids: torch.Tensor) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(ids)
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


@torch.no_grad()
def bytes_touched(model: CloverModel, cache: ModelCache, step: str, ids: torch.Tensor) -> dict[str, int]:
    """The bytes a step must read at least (module doc), from the routing of this call's tokens."""
    config = model.config
    used: list[int] = []

    def count(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        assert isinstance(module, SparseMoe)
        expert_ids, _ = route(module.gate(args[0]), module.top_k)
        used.append(int(expert_ids.unique().numel()))

    handles = [layer.mlp.register_forward_pre_hook(count) for layer in model.layers]
    try:
        step_call(model, cache, step)(ids)
    finally:
        for handle in handles:
            handle.remove()
    element = model.embed_tokens.weight.element_size()
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size * element
    routed = model.layers[0].mlp.experts
    if isinstance(routed, QuantizedRoutedExperts):  # its bytes and scales
        per_expert = routed.nbytes // config.num_experts
    experts = sum(used) * per_expert
    dense = 0
    for layer in model.layers:
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn
        dense += sum(p.numel() * p.element_size() for p in mixer.parameters())
        moe = layer.mlp
        dense += sum(
            p.numel() * p.element_size()
            for m in (moe.gate, moe.shared_expert, moe.shared_expert_gate)
            for p in m.parameters()
        )
    state = 0
    rows = cache.length + STEPS[step]["tokens"]
    for layer_state in cache.layers:
        if isinstance(layer_state, GdnState):
            state += sum(t.numel() * t.element_size() for t in layer_state.tensors())
        else:
            state += 2 * rows * layer_state.key_buffer[0].numel() * layer_state.key_buffer.element_size()
    head = model.lm_head.weight.numel() * element if STEPS[step]["logit_rows"] else 0
    return {
        "routed_experts": experts,
        "experts_per_layer": round(sum(used) / len(used), 1),
        "dense_layers": dense,
        "state": state,
        "lm_head": head,
        "total": experts + dense + state + head,
    }


@torch.no_grad()
def quantize_experts(model: CloverModel, scheme: str) -> dict[str, Any]:
    """Every layer's routed experts replaced by ``scheme`` ones ("fp8": 128 x 128 block scales;
    "int4": groups of 128), quantised one expert's matrix at a time from what the layer holds (its
    dense weights, or another scheme's, dequantised), so only one layer is ever held twice."""
    start = time.perf_counter()
    config, device = model.config, model.device
    block = FP8_BLOCK if scheme == "fp8" else (1, INT4_GROUP)
    for layer in model.layers:
        old = layer.mlp.experts
        new = QuantizedRoutedExperts(config, scheme, block, device=device)
        for name in ("gate_up_proj", "down_proj"):
            weight = getattr(old, name)
            for expert in range(config.num_experts):
                dense = (
                    weight.expert(expert, torch.float32)
                    if isinstance(weight, QuantizedWeight)
                    else weight[expert].float()
                )
                if name == "gate_up_proj":  # gate rows and up rows: a scale grid each
                    for half, rows in enumerate(dense.chunk(2)):
                        new.store(name, expert, half, rows, None, block)
                else:
                    new.store(name, expert, None, dense, None, block)
        layer.mlp.experts = new
        del old
    synchronize(device)
    return {
        "scheme": scheme,
        "block": list(block),
        "routed_experts_bytes": sum(layer.mlp.experts.nbytes for layer in model.layers),
        "seconds": time.perf_counter() - start,
    }


def graph_call(graphs: StepGraphs, step: str) -> Callable[[torch.Tensor], Any]:
    """The step replayed as a CUDA graph (captured on first call), rewound like :func:`step_call`."""
    spec, cache = STEPS[step], graphs.cache
    length, commits = cache.length, cache.commits
    commit = spec["tokens"] if spec["commit"] is True else int(spec["commit"])
    shape = StepShape(spec["tokens"], spec["attention"], commit, 0, spec["logit_rows"])

    def call(ids: torch.Tensor) -> Any:
        out = graphs(ids, shape)
        if out is None:
            raise RuntimeError(f"the step's capture failed: {graphs.failed[shape]}")
        if commit:
            rewind(cache, length, commits)
        return out

    return call


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if expected.numel() == 0:
        return 0.0
    return float(
        (actual.double() - expected.double()).abs().max() / expected.double().abs().max().clamp_min(1e-30)
    )


def time_steps(
    model: CloverModel,
    context: int,
    *,
    bandwidth: float | None,
    budget: Budget,
    repeats: int,
) -> dict[str, dict[str, Any]]:
    """Every step of :data:`STEPS` at ``context`` committed tokens: median time, bytes, floor,
    operators; on CUDA also replayed as a CUDA graph (time, and its logits against eager ones)."""
    cache = random_context(model, context, extra=128)
    graphs = StepGraphs(model, cache) if model.device.type == "cuda" else None
    out: dict[str, dict[str, Any]] = {}
    for step in STEPS:
        if not budget.allows(f"step {step}"):
            continue
        inputs = [step_ids(model, step, seed) for seed in range(ROTATIONS)]
        call = step_call(model, cache, step)
        try:
            seconds, calls = median_seconds(call, inputs, model.device, repeats=repeats, budget=budget)
            row: dict[str, Any] = {"median_ms": seconds * 1e3, "calls": calls}
            row["bytes"] = bytes_touched(model, cache, step, inputs[0])
            row["operators"] = operators_per_call(call, inputs[0])
            if model.device.type == "cuda":
                row["cuda_kernels"] = cuda_kernels_per_call(call, inputs[0])
        except Exception as exc:  # recorded, the run goes on
            out[step] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if bandwidth:
            floor = row["bytes"]["total"] / bandwidth
            row.update(floor_ms=floor * 1e3, over_floor=seconds / floor)
        if graphs is not None and budget.allows(f"step {step} as a CUDA graph"):
            try:
                replay = graph_call(graphs, step)
                row["graph_logits_error"] = _relative_error(replay(inputs[0]).clone(), call(inputs[0]))
                graph_s, _ = median_seconds(replay, inputs, model.device, repeats=repeats, budget=budget)
                row["graph_ms"] = graph_s * 1e3
                if bandwidth:
                    row["graph_over_floor"] = graph_s / (row["bytes"]["total"] / bandwidth)
            except Exception as exc:
                row["graph_error"] = f"{type(exc).__name__}: {exc}"
        out[step] = row
        synchronize(model.device)
    return out


def mode_rates(
    steps: dict[str, dict[str, Any]], tokens_per_forward: list[float], block: int
) -> list[dict[str, Any]]:
    """Tokens/s of each decoding mode from the step times, at each tokens-per-forward figure.

    Diffusion: ``block / tpf`` denoising passes per block plus its commit pass (or, fused, the
    first pass is the 64-token fused step). Self-speculative: a round is one draft pass and one
    64-token verify and yields ``tpf`` tokens per forward, i.e. ``2 * tpf`` per round.
    Autoregressive: one token per ``ar_1`` step."""

    def ms(name: str) -> float | None:
        return steps.get(name, {}).get("median_ms")

    rows = []
    denoise, commit, fused, verify, ar = (
        ms(n) for n in ("denoise_32", "commit_32", "fused_64", "verify_64", "ar_1")
    )
    for tpf in tokens_per_forward:
        passes = max(1.0, block / tpf)
        row: dict[str, Any] = {"tokens_per_forward": tpf}
        if denoise and commit:
            row["diffusion"] = block / ((passes * denoise + commit) / 1e3)
        if denoise and fused:
            row["diffusion_fused"] = block / (((passes - 1) * denoise + fused) / 1e3)
        if denoise and verify:
            row["self_speculative"] = 2 * tpf / ((denoise + verify) / 1e3)
        if ar:
            row["autoregressive"] = 1e3 / ar
        rows.append(row)
    return rows
