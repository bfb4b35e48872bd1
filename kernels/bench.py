"""Benchmark cases of the kernels at Clover-35B-A3B's sizes, for ``bench/gpu_bench.py``.

Each operator folder has a ``benchmark.case(...)`` building random inputs on a device and
returning a :class:`KernelCase`: the Triton call, the reference call on the same inputs, and the
bytes the operator must move at least (inputs read once, outputs written once), so the timing
script can report GB/s and the ratio to the measured copy bandwidth; :func:`measure` times one. Building a case does host
work (it may read routing back to count touched experts); ``run`` does not.

``CLOVER`` repeats the numbers of ``engine/model/configs/clover-35b-a3b.json`` (kernels never import the
engine; tests/kernels/test_bench.py checks the two agree).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CloverSizes:
    """The model dimensions the kernels see."""

    hidden: int = 2048
    experts: int = 256
    top_k: int = 8
    moe_inner: int = 512
    shared_inner: int = 512
    vocab: int = 248320
    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    rotary_dim: int = 64  # partial_rotary_factor 0.25 of the head
    gdn_key_heads: int = 16
    gdn_value_heads: int = 32
    gdn_key_dim: int = 128
    gdn_value_dim: int = 128
    conv_kernel: int = 4
    right_conv_kernel: int = 4
    block_size: int = 32
    mask_token_id: int = 248077
    rms_eps: float = 1e-6

    @property
    def conv_dim(self) -> int:
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim


CLOVER = CloverSizes()


@dataclass(frozen=True)
class KernelCase:
    """One timed operator call. ``run`` cycles through ``copies`` input sets (so a small working set
    is not served from L2 on every call), starting with the first; ``reference`` computes the first
    set with the PyTorch reference, so the result of the case's first ``run()`` is comparable (None
    when no reference result is comparable: a sampled draw)."""

    name: str
    run: Callable[[], object]
    reference: Callable[[], object] | None
    bytes_moved: int
    shape: str


def relative_error(got: object, want: object) -> float:
    """max |got - want| / max |want| over tensors (or matching tuples of tensors), in float64."""
    gots = got if isinstance(got, Sequence) else (got,)
    wants = want if isinstance(want, Sequence) else (want,)
    worst = 0.0
    for g, w in zip(gots, wants, strict=True):
        g, w = g.double(), w.double()
        scale = w.abs().max().item() or 1.0
        worst = max(worst, (g - w).abs().max().item() / scale)
    return worst


def measure(
    case: KernelCase, *, warmup: int = 3, repeats: int = 20, time_reference: bool = True
) -> dict[str, object]:
    """Run a case: its error against the reference (first input set), then the median time of
    ``repeats`` calls after ``warmup`` (CUDA events on a GPU, the wall clock elsewhere), and the
    effective bandwidth ``bytes_moved / median``.

    - ``time_reference``: time the PyTorch reference the same way right after, in the same run
      (``reference_ms``, and ``speedup``: reference time over kernel time).

    On a GPU the L2 cache is flushed before every timed call (a buffer of twice its size is written,
    outside the timed events), so every input comes from memory as in a model whose layers' weights
    together far exceed L2, for the kernel and the reference alike.
    """
    first = case.run()
    error = relative_error(first, case.reference()) if case.reference is not None else None
    cuda = torch.cuda.is_available() and _on_cuda(first)
    flush = _l2_flush(first) if cuda else None
    median = median_seconds(case.run, warmup=warmup, repeats=repeats, cuda=cuda, flush=flush)
    row: dict[str, object] = {
        "name": case.name,
        "shape": case.shape,
        "median_ms": median * 1e3,
        "bytes": case.bytes_moved,
        "gb_per_s": case.bytes_moved / median / 1e9 if median > 0 else None,
        "relative_error": error,
    }
    if time_reference and case.reference is not None:
        reference = median_seconds(case.reference, warmup=warmup, repeats=repeats, cuda=cuda, flush=flush)
        row["reference_ms"] = reference * 1e3
        row["speedup"] = reference / median if median > 0 else None
    return row


def _l2_flush(result: object) -> torch.Tensor:
    """A buffer twice the L2 cache of the device ``result`` is on (``zero_()`` it to flush L2)."""
    tensors = result if isinstance(result, Sequence) else (result,)
    device = next(t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda)
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 1024**2
    return torch.empty(2 * l2, dtype=torch.uint8, device=device)


def median_seconds(
    call: Callable[[], object], *, warmup: int, repeats: int, cuda: bool, flush: torch.Tensor | None = None
) -> float:
    """Median seconds of ``repeats`` calls after ``warmup``: CUDA events with ``cuda`` (``flush``
    zeroed before each, outside the events), else the wall clock."""
    for _ in range(warmup):
        call()
    times: list[float] = []
    for _ in range(repeats):
        if cuda:
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def _on_cuda(result: object) -> bool:
    tensors = result if isinstance(result, Sequence) else (result,)
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)


def cycling(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """A callable running ``calls`` in turn, one per call."""
    state = {"next": 0}

    def run() -> object:
        i = state["next"]
        state["next"] = (i + 1) % len(calls)
        return calls[i]()

    return run


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
