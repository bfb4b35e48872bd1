"""Timing pieces of ``gpu_bench.py``: the wall-clock budget, device timers and copy bandwidth.

On CUDA a measurement is timed with CUDA events around each call (no host round trip inside the
timed region) and inputs rotate between several copies so that a call does not find the previous
call's data in L2; on the CPU the same code uses ``time.perf_counter``. Every figure is a median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


class Budget:
    """Wall clock since the run started; work that would start past ``seconds`` is skipped and named."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()
        self.skipped: list[str] = []

    def used(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def allows(self, what: str, needs: float = 0.0) -> bool:
        """Whether ``what`` (expected to take ``needs`` seconds) may start; if not, it is recorded."""
        if self.left() <= needs:
            self.skipped.append(
                f"{what}: skipped, {self.left():.0f} s of the {self.seconds:.0f} s budget left"
            )
            return False
        return True


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    run: Callable[[Any], object],
    inputs: Sequence[Any],
    device: torch.device,
    *,
    warmup: int = 2,
    repeats: int = 10,
    budget: Budget | None = None,
) -> tuple[float, int]:
    """(median seconds, timed calls) of ``run(inputs[i % len(inputs)])`` after ``warmup`` calls.

    Stops after the first timed call once the budget is spent."""
    for i in range(warmup):
        run(inputs[i % len(inputs)])
    synchronize(device)
    times: list[float] = []
    for i in range(repeats):
        item = inputs[i % len(inputs)]
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(item)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            run(item)
            times.append(time.perf_counter() - began)
        if budget is not None and budget.left() <= 0:
            break
    return statistics.median(times), len(times)


def copy_bandwidth(device: torch.device, megabytes: int, budget: Budget) -> dict[str, float]:
    """Device-to-device copy rate, counting bytes read plus bytes written (what a kernel's traffic
    is compared with)."""
    count = megabytes * 2**20 // 2
    source = [torch.empty(count, dtype=torch.bfloat16, device=device).normal_() for _ in range(2)]
    target = torch.empty_like(source[0])
    seconds, calls = median_seconds(lambda src: target.copy_(src), source, device, repeats=20, budget=budget)
    moved = 2 * source[0].numel() * source[0].element_size()
    return {"bytes": moved, "median_s": seconds, "gb_per_s": moved / seconds / 1e9, "calls": calls}
