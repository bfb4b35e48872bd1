"""Every Triton kernel compiled ahead of time for Hopper (sm_90a), on any machine, at Clover's sizes.

The launchers run at the real model's shapes on meta tensors (shapes and strides, no data) under a
stand-in driver that only names the target, so Triton's own binder specialises each launch as it
would on an H100 or H200; a compile hook takes the launch instead of compiling and running it. Each
distinct launch is then compiled by Triton and ptxas (shipped in the triton wheel), whose report
gives registers and spills (and the PTX its block-wide barriers). tests/kernels/test_hopper_compile.py runs it in CI, in a process
without ``TRITON_INTERPRET``: ``python -m clover_agent.kernels.hopper_compile [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes

#: The GPU the kernels are compiled for: compute capability 9.0 (Hopper: H100, H200).
ARCH = 90
#: Decoding steps: one 32-token block, and the 64-token step that commits a block and denoises the
#: next (its attention and GDN calls are two 32-row calls, causal then block-causal).
DECODE_TOKENS = (32, 64)
#: Prompt prefill chunks: 1024 tokens give the MoE its middle tile, 4096 its largest.
PREFILL_TOKENS = (1024, 4096)
#: Committed context before a decoding step: a short prompt, and the config's
#: ``max_position_embeddings`` (the fewest and the most attention key splits).
CONTEXTS = (4096, 131072)
#: Dynamic shared memory one block may use on Hopper (``cudaDevAttrMaxSharedMemoryPerBlockOptin``).
MAX_SHARED = 232448
#: Quantised routed experts the MoE GEMMs also read (``kernels/moe/quant.py``).
EXPERT_SCHEMES = ("fp8", "int4")
#: The operator folders holding a ``triton_kernels.py``.
FOLDERS = tuple(sorted(p.parent.name for p in Path(__file__).parent.glob("*/triton_kernels.py")))

_BF16 = torch.bfloat16
_F32 = torch.float32


@dataclass
class Compiled:
    """One distinct launch (a kernel and its specialisation) and what compiling it gave."""

    kernel: str
    module: str
    #: The places that launched it, e.g. ``decode 32``, ``prefill 4096``.
    steps: list[str]
    #: Its constexpr arguments (block sizes and switches) by name.
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    ok: bool = False
    error: str | None = None
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    #: Block-wide barriers (``bar.sync``) in the PTX: a loop's body is counted once, so for a
    #: kernel that loops over time steps this is about the barriers each step waits on.
    barriers: int | None = None
    #: Hopper's warpgroup MMA (``wgmma.mma_async``) instructions in the PTX; 0 with ``mma.sync``
    #: (the Ampere tensor-core path) or no tensor cores at all.
    wgmma: int | None = None
    #: The distinct tensor-core instructions in the PTX (``mma.sync...`` or ``wgmma.mma_async...``
    #: with their shapes and operand types, e.g. ``...f32.bf16.bf16.f32``): what the products run on.
    mma: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The package's helper ``@triton.jit`` functions it calls (inlined), by ``module.name``.
    calls: list[str] = field(default_factory=list)

    @property
    def decode(self) -> bool:
        """Launched by a decoding step (every step of every generated block runs it)."""
        return any(step.startswith("decode") for step in self.steps)

    @property
    def spills(self) -> int:
        return (self.spill_stores or 0) + (self.spill_loads or 0)

    @property
    def variant(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.constexprs.items())


@dataclass
class Report:
    """Every compiled launch, and the kernels nothing compiled (a new kernel no step launches)."""

    target: str
    triton: str
    compiled: list[Compiled]
    uncovered: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        rows = []
        for row in self.compiled:
            rows.append({**asdict(row), "decode": row.decode, "spills": row.spills, "variant": row.variant})
        return {**asdict(self), "compiled": rows}


def hopper_problem() -> str | None:
    """None when Triton's NVIDIA backend and its ptxas are here (no GPU needed), else the reason."""
    try:
        from triton import knobs
        from triton.backends import backends
    except ImportError as exc:
        return f"triton is not installed ({exc})"
    if "nvidia" not in backends:
        return "triton's nvidia backend is not installed"
    try:
        ptxas = knobs.nvidia.ptxas_blackwell.path  # what the backend runs for sm_90 and later
    except Exception as exc:  # the knob raises whatever its lookup met
        return f"ptxas not found ({exc})"
    if not ptxas or not os.access(ptxas, os.X_OK):
        return f"ptxas not found at {ptxas!r}"
    return None


# --- the launches ---------------------------------------------------------------------------------


def _meta(*shape: int, dtype: torch.dtype = _BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _norms(tokens: int, s: CloverSizes) -> None:
    """The layers' RMS norms: hidden rows (alone, and after the residual add), and the attention's
    q / k norms over head rows with the rotary embedding."""
    from clover_agent.kernels.norms.norms import add_rms_norm, rms_norm, rms_norm_rotary

    rms_norm(_meta(tokens, s.hidden), _meta(s.hidden), s.rms_eps)
    add_rms_norm(_meta(tokens, s.hidden), _meta(tokens, s.hidden), _meta(s.hidden), s.rms_eps)
    # the query half of q_proj's [T, H, 2D] output (the gate is the other half), then k: norm and rotary
    query = _meta(tokens, s.heads, 2 * s.head_dim)[..., : s.head_dim]
    cos, sin = _meta(tokens, s.rotary_dim), _meta(tokens, s.rotary_dim)
    rms_norm_rotary(query, _meta(s.head_dim), s.rms_eps, cos, sin)
    rms_norm_rotary(_meta(tokens, s.kv_heads, s.head_dim), _meta(s.head_dim), s.rms_eps, cos, sin)


def _gdn(tokens: int, s: CloverSizes, *, bidirectional: bool, commit: int) -> None:
    """A GDN layer's core as engine/model/gdn.py calls it: the gates from the fused input
    projection's a and b columns, short conv, then the scans and the norm."""
    from clover_agent.kernels.gated_delta_rule.gdn import gated_delta_net, gdn_gates
    from clover_agent.kernels.short_conv.conv import short_conv

    channels, kernel = s.conv_dim, s.conv_kernel
    heads = s.gdn_value_heads
    projection = _meta(tokens, channels + heads * s.gdn_value_dim + 2 * heads)
    gdn_gates(
        projection[:, -2 * heads : -heads], projection[:, -heads:], _meta(heads, dtype=_F32), _meta(heads)
    )
    right = _meta(channels, s.right_conv_kernel) if bidirectional else None
    mixed = short_conv(
        _meta(tokens, channels),
        _meta(channels, kernel),
        _meta(channels, kernel - 1),
        right,
        s.block_size,
        True,
    )
    hk, hv, dk, dv = s.gdn_key_heads, s.gdn_value_heads, s.gdn_key_dim, s.gdn_value_dim
    key_dim = hk * dk
    gated_delta_net(
        mixed[:, :key_dim].reshape(tokens, hk, dk),
        mixed[:, key_dim : 2 * key_dim].reshape(tokens, hk, dk),
        mixed[:, 2 * key_dim :].reshape(tokens, hv, dv),
        _meta(tokens, hv, dtype=_F32),
        _meta(tokens, hv),
        _meta(hv, dk, dv, dtype=_F32),
        dk**-0.5,
        _meta(tokens, hv, dv),
        _meta(dv),
        s.rms_eps,
        commit=commit,
        block_size=s.block_size if bidirectional else None,
        mix_logits=_meta(hv, 2) if bidirectional else None,
        normalize_qk=True,
    )


def _attention(tokens: int, s: CloverSizes, *, context: int, rule: int) -> None:
    """One attention layer's step: the new K/V into the cache, then the gated split-K attention."""
    from clover_agent.kernels.attention.kv_attention import attention_step

    heads, kv_heads, d = s.heads, s.kv_heads, s.head_dim
    q_and_gate = _meta(tokens, heads, 2 * d)
    capacity = context + tokens
    attention_step(
        q_and_gate[..., :d],
        _meta(tokens, kv_heads, d),
        _meta(tokens, kv_heads, d),
        _meta(capacity, kv_heads, d),
        _meta(capacity, kv_heads, d),
        _meta(1, dtype=torch.int64),
        block_size=rule,
        scale=d**-0.5,
        gate=q_and_gate[..., d:],
    )


def _expert_weights(s: CloverSizes, scheme: str | None) -> tuple[Any, Any]:
    """The routed experts' ``gate_up_proj`` and ``down_proj``: bf16, or quantised as loaded
    (``kernels/moe/quant.py``: FP8 with 128 x 128 block scales, INT4 with groups of 128)."""
    from clover_agent.kernels.moe import quant

    e, h, i = s.experts, s.hidden, s.moe_inner
    if scheme is None:
        return _meta(e, 2 * i, h), _meta(e, h, i)

    def weight(rows: int, cols: int, halves: int) -> quant.QuantizedWeight:
        if scheme == "fp8":
            block, packed, data_dtype, scale_dtype = quant.FP8_BLOCK, cols, torch.float8_e4m3fn, _F32
        else:
            block, packed, data_dtype, scale_dtype = (
                (1, quant.INT4_GROUP),
                (cols + 1) // 2,
                torch.uint8,
                torch.float16,
            )
        grid_rows, grid_cols = quant.scale_grid(rows, cols, block)
        data = _meta(e, halves * rows, packed, dtype=data_dtype)
        return quant.QuantizedWeight(
            scheme, data, _meta(e, halves * grid_rows, grid_cols, dtype=scale_dtype), block, cols, halves
        )

    return weight(i, h, 2), weight(h, i, 1)


def _moe(tokens: int, s: CloverSizes, scheme: str | None = None) -> None:
    """The MoE block after its projections: routing, both grouped GEMMs, the combine; the experts
    bf16 or quantised (``scheme``)."""
    from clover_agent.kernels.moe.fused_moe import sparse_moe

    h = s.hidden
    gate_up, down = _expert_weights(s, scheme)
    sparse_moe(
        _meta(tokens, h),
        _meta(tokens, s.experts),
        s.top_k,
        gate_up,
        down,
        shared=_meta(tokens, h),
        shared_gate_logits=_meta(tokens, 1),
        residual=_meta(tokens, h),
    )


def _token_choice(tokens: int, s: CloverSizes) -> None:
    """A denoising step's choice and fill, in each of the choice kernel's modes: greedy; the coding
    preset (top-k, top-p); top-p alone and a top-k past the candidate list (both by bisection); the
    thinking controls (penalties, per-row biases, forced rows)."""
    from clover_agent.kernels.low_confidence.choose import MAX_TOP_K, low_confidence_step
    from clover_agent.kernels.low_confidence.reference import LogitsAdjustment, TokenChoice

    vocab = s.vocab
    counts = _meta(vocab, dtype=_F32)
    penalty = LogitsAdjustment(counts=counts, repetition_penalty=1.05)
    controls = LogitsAdjustment(
        counts=counts,
        presence_penalty=0.5,
        frequency_penalty=0.1,
        bias_token_ids=_meta(2, dtype=torch.int64),
        row_bias=_meta(tokens, 2, dtype=_F32),
        forced_token=_meta(tokens, dtype=torch.int64),
    )
    mask = s.mask_token_id
    modes = [
        (TokenChoice(mask_token_id=mask), penalty),
        (TokenChoice(temperature=0.6, top_k=20, top_p=0.95, mask_token_id=mask), penalty),
        (TokenChoice(temperature=0.7, top_p=0.9, mask_token_id=mask, confidence_rule="sglang"), None),
        (TokenChoice(temperature=1.0, top_k=4 * MAX_TOP_K, top_p=0.9, mask_token_id=mask), None),
        (TokenChoice(temperature=0.6, top_k=20, top_p=0.95, mask_token_id=mask), controls),
    ]
    for choice, adjustment in modes:
        low_confidence_step(
            _meta(tokens, vocab, dtype=_F32),
            _meta(tokens, dtype=torch.int64),
            _meta(tokens, dtype=torch.bool),
            choice,
            0.9,
            adjustment,
            seed=_meta(1, dtype=torch.int64),
        )


def steps(sizes: CloverSizes = CLOVER) -> list[tuple[str, Callable[[], None]]]:
    """Each place the kernels run, named, as a call of the launchers on meta tensors."""
    found: list[tuple[str, Callable[[], None]]] = []

    def add(name: str, call: Callable[[], None]) -> None:
        found.append((name, call))

    for t in DECODE_TOKENS:
        add(f"decode {t}", functools.partial(_norms, t, sizes))
        add(f"decode {t}", functools.partial(_moe, t, sizes))
        for scheme in EXPERT_SCHEMES:
            add(f"decode {t}", functools.partial(_moe, t, sizes, scheme))
    block = sizes.block_size  # every decoding GDN, attention and choice call has one block's rows
    step = f"decode {block}"
    add(step, lambda: _gdn(block, sizes, bidirectional=True, commit=0))  # denoise
    add(step, lambda: _gdn(block, sizes, bidirectional=False, commit=block))  # commit
    add(step, lambda: _gdn(block, sizes, bidirectional=True, commit=block))  # denoise, then commit
    for context in CONTEXTS:
        for rule in (block, 1):  # the block's rows; the committed block's rows, causal
            add(step, functools.partial(_attention, block, sizes, context=context, rule=rule))
    add(step, lambda: _token_choice(block, sizes))
    fused = 2 * block  # the fused step as one call (kernels/bench.py's case)
    add(f"decode {fused}", lambda: _gdn(fused, sizes, bidirectional=True, commit=fused))
    for t in PREFILL_TOKENS:
        add(f"prefill {t}", functools.partial(_norms, t, sizes))
        add(f"prefill {t}", functools.partial(_moe, t, sizes))
        for scheme in EXPERT_SCHEMES:
            add(f"prefill {t}", functools.partial(_moe, t, sizes, scheme))
        add(f"prefill {t}", functools.partial(_gdn, t, sizes, bidirectional=False, commit=t))
        add(f"prefill {t}", functools.partial(_gdn, t, sizes, bidirectional=True, commit=t))
        add(f"prefill {t}", functools.partial(_attention, t, sizes, context=0, rule=1))
    return found


# --- recording and compiling ----------------------------------------------------------------------


class _StandIn:
    """The driver Triton's launch path asks for a device, a stream and the target: only the target
    is real. Its device is a name no real device has, so Triton's per-device caches of a process
    that also has a GPU are left alone."""

    DEVICE = "hopper-compile"

    def get_current_device(self) -> str:
        return self.DEVICE

    def get_current_stream(self, device: object = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", ARCH, 32)


@dataclass
class _Launch:
    fn: Any
    signature: dict[str, str]
    constants: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    options: dict[str, Any]
    row: Compiled


@contextlib.contextmanager
def _recording(launches: dict[str, _Launch], step: list[str]) -> Iterator[None]:
    """Launches go to ``launches`` (by Triton's own cache key: one entry per distinct compile), each
    noting ``step[0]``, instead of being compiled and run."""
    from triton import knobs
    from triton.runtime.driver import driver

    def hook(*, key: Any, repr: str, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        jit = fn.jit_function
        ident = f"{jit.module}.{fn.name}:{key}"
        if ident not in launches:
            constants = compile["constants"]
            constexprs = {jit.arg_names[path[0]]: value for path, value in constants.items()}
            options = {k: compile[k] for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion")}
            row = Compiled(fn.name, jit.module, [], constexprs, compile["num_warps"], compile["num_stages"])
            attrs = compile["configs"][0]  # the arguments' alignment, as the binder found it
            launches[ident] = _Launch(jit, compile["signature"], constants, attrs, options, row)
        if step[0] not in launches[ident].row.steps:
            launches[ident].row.steps.append(step[0])
        return True  # handled: Triton neither compiles nor launches

    previous = driver._active  # set back as found (None: the default driver, made when asked for)
    with knobs.runtime.scope():
        knobs.runtime.jit_cache_hook = hook
        driver.set_active(_StandIn())
        try:
            yield
        finally:
            driver._active = previous


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def _compile(launch: _Launch) -> None:
    """Compile one launch for sm_90a into ``launch.row``: registers, spills and stack from ptxas's
    report (Triton prints it when asked), shared memory from Triton's metadata."""
    import triton
    from triton.backends.compiler import GPUTarget

    row = launch.row
    began = time.perf_counter()
    log = io.StringIO()
    try:
        src = triton.compiler.ASTSource(launch.fn, launch.signature, launch.constants, launch.attrs)
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options=launch.options)
    except Exception as exc:  # any failure to compile is the finding
        row.error = f"{type(exc).__name__}: {exc}".strip()[:4000]
        row.seconds = time.perf_counter() - began
        return
    row.seconds = time.perf_counter() - began
    report = log.getvalue()
    for name, pattern in _PTXAS.items():
        match = pattern.search(report)
        setattr(row, name, int(match.group(1)) if match else None)
    row.shared = int(kernel.metadata.shared)
    ptx = kernel.asm.get("ptx", "")
    row.barriers = len(re.findall(r"\b(?:bar|barrier)\.sync\b", ptx))
    row.wgmma = len(re.findall(r"\bwgmma\.mma_async\b", ptx))
    row.mma = sorted(set(re.findall(r"\b(?:mma\.sync|wgmma\.mma_async)(?:\.\w+)+", ptx)))
    # the initial IR names each function it calls by module, name and specialisation
    called = re.findall(r"tt\.call @\"?([\w.]+?)__", kernel.asm.get("source", ""))
    row.calls = sorted({name for name in called if name.startswith("clover_agent.")})
    if row.registers is None:
        row.error = "ptxas printed no register count:\n" + report[-2000:]
    elif row.shared > MAX_SHARED:
        row.error = f"needs {row.shared} bytes of shared memory, more than Hopper's {MAX_SHARED}"
    else:
        row.ok = True


def kernel_functions() -> dict[str, Any]:
    """Every ``@triton.jit`` function of the ``triton_kernels`` modules, by ``module.name``."""
    from triton.runtime.jit import JITFunction

    found = {}
    for folder in FOLDERS:
        name = f"clover_agent.kernels.{folder}.triton_kernels"
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, JITFunction) and value.module == name:
                found[f"{name}.{attr}"] = value
    return found


def compile_all(sizes: CloverSizes = CLOVER, progress: Callable[[str], None] | None = None) -> Report:
    """Record every step's launches, then compile each distinct one for sm_90a."""
    from clover_agent.kernels.runtime import interpreting

    if interpreting():
        raise RuntimeError(
            "the kernels were decorated for Triton's interpreter (TRITON_INTERPRET=1 when they were "
            "imported); compile them in a process without it"
        )
    import triton
    from triton import knobs

    began = time.perf_counter()
    functions = kernel_functions()
    launches: dict[str, _Launch] = {}
    step = [""]
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="hopper-compile-") as cache:
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION is unset")
        with _recording(launches, step):
            for name, call in steps(sizes):
                step[0] = name
                call()
        with knobs.cache.scope(), knobs.compilation.scope(), knobs.nvidia.scope():
            knobs.cache.dir = cache  # nothing from or into the user's cache
            knobs.compilation.always_compile = True
            knobs.nvidia.dump_ptxas_log = True  # ptxas's report, printed: _compile reads it
            for launch in launches.values():
                if progress:
                    progress(f"{launch.row.kernel} [{launch.row.variant}]")
                _compile(launch)
    compiled = sorted((launch.row for launch in launches.values()), key=lambda r: (r.module, r.kernel))
    reached = {f"{row.module}.{row.kernel}" for row in compiled}
    helpers = {called for row in compiled for called in row.calls}
    uncovered = sorted(set(functions) - reached - helpers)
    return Report(f"sm_{ARCH}a", triton.__version__, compiled, uncovered, time.perf_counter() - began)


# --- output ---------------------------------------------------------------------------------------


def table(report: Report) -> str:
    """The report as a table: one line per compiled launch."""
    head = (
        "kernel",
        "steps",
        "warps",
        "regs",
        "spill st/ld",
        "stack",
        "shared",
        "barriers",
        "s",
        "constexprs",
    )
    lines = []
    for row in report.compiled:
        spills = f"{row.spill_stores}/{row.spill_loads}"
        numbers = (
            (str(row.registers), spills, str(row.stack), str(row.shared), str(row.barriers))
            if row.ok
            else ("FAILED", "", "", "", "")
        )
        where = ", ".join(row.steps)
        lines.append((row.kernel, where, str(row.num_warps), *numbers, f"{row.seconds:.1f}", row.variant))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
    out = [f"Triton {report.triton}, target {report.target}"]
    for line in (head, *lines):
        out.append("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)).rstrip())
    for row in report.compiled:
        if row.error:
            out.append(f"\n{row.kernel} [{row.variant}] failed:\n{row.error}")
    if report.uncovered:
        out.append("\nnot compiled by any step (add a launch to steps()): " + ", ".join(report.uncovered))
    out.append(f"\n{len(report.compiled)} launches compiled in {report.seconds:.0f} s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Compile and print the table (``--json``: the report as JSON). Exit 1 when a kernel failed to
    compile or is compiled by no step, 2 when it cannot run here; spills are reported, not judged."""
    parser = argparse.ArgumentParser(
        prog="python -m clover_agent.kernels.hopper_compile", description=__doc__
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    problem = hopper_problem()
    if problem is None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        problem = "TRITON_INTERPRET is set: the kernels would be interpreted, not compiled"
    if problem:
        print(f"cannot compile for sm_{ARCH}a: {problem}", file=sys.stderr)
        return 2
    report = compile_all(
        progress=None if args.json else lambda what: print(f"compiling {what}", file=sys.stderr)
    )
    print(json.dumps(report.to_json(), indent=1, default=str) if args.json else table(report))
    return 0 if all(row.ok for row in report.compiled) and not report.uncovered else 1


if __name__ == "__main__":
    sys.exit(main())
