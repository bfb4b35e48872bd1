"""Routed experts in host memory, computed by the CPU: what one MoE layer's CPU side costs.

Times ``kernels.moe.reference.moe_experts`` (what ``SparseMoe.host_forward`` runs on the host) at
Clover's real expert shapes (256 experts, hidden 2048, expert width 512, top-8) with random weights,
for 1 token (an autoregressive step) and 32 tokens (a diffusion block), each token routed to 8
distinct experts drawn uniformly (a fresh routing every run). Median of a few runs; the 40-layer
figure is that median times 40, an extrapolation from one layer, not a measured forward. The
copies to and from a GPU and everything else in the forward are not in it.

    .venv/bin/python bench/host_experts_bench.py [--runs 5] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from decode_bench import cpu_model  # bench/ is on the path: this script's folder

from clover_agent.kernels.moe.quant import QuantizedWeight
from clover_agent.kernels.moe.reference import moe_experts

SECTION_START = "<!-- host-experts-bench:start -->"
SECTION_END = "<!-- host-experts-bench:end -->"
EXPERTS, HIDDEN, INNER, TOP_K, LAYERS, GROUP = 256, 2048, 512, 8, 40, 128
TOKENS = (1, 32)


def weights(fmt: str) -> tuple[torch.Tensor | QuantizedWeight, torch.Tensor | QuantizedWeight]:
    """Random gate_up [E, 2I, H] and down [E, H, I] in ``fmt`` ("float32", "bf16", "int4")."""
    gen = torch.Generator().manual_seed(0)
    if fmt == "int4":  # random bytes (two weights each) and float16 scales per group of 128 inputs
        gate_up = QuantizedWeight(
            "int4",
            torch.randint(0, 256, (EXPERTS, 2 * INNER, HIDDEN // 2), dtype=torch.uint8, generator=gen),
            (torch.rand(EXPERTS, 2 * INNER, HIDDEN // GROUP, generator=gen) * 0.01).half(),
            (1, GROUP),
            HIDDEN,
            halves=2,
        )
        down = QuantizedWeight(
            "int4",
            torch.randint(0, 256, (EXPERTS, HIDDEN, INNER // 2), dtype=torch.uint8, generator=gen),
            (torch.rand(EXPERTS, HIDDEN, INNER // GROUP, generator=gen) * 0.01).half(),
            (1, GROUP),
            INNER,
        )
        return gate_up, down
    dtype = torch.float32 if fmt == "float32" else torch.bfloat16
    gate_up = (torch.randn(EXPERTS, 2 * INNER, HIDDEN, generator=gen) * 0.02).to(dtype)
    down = (torch.randn(EXPERTS, HIDDEN, INNER, generator=gen) * 0.02).to(dtype)
    return gate_up, down


def routing(tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])
    w = torch.rand(tokens, TOP_K, generator=gen)
    return ids, w / w.sum(-1, keepdim=True)


def expert_bytes(fmt: str) -> int:
    elements = 3 * HIDDEN * INNER
    if fmt == "int4":
        return elements // 2 + 3 * HIDDEN * INNER // GROUP * 2
    return elements * (4 if fmt == "float32" else 2)


def measure(runs: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    # (expert format, activation dtype): INT4 is dequantised to the activations' dtype per expert.
    for fmt, act in (
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("int4", torch.float32),
        ("int4", torch.bfloat16),
    ):
        gate_up, down = weights(fmt)
        gen = torch.Generator().manual_seed(1)
        for tokens in TOKENS:
            times = []
            distinct = []
            for run in range(runs + 1):  # the first is a warm-up
                ids, w = routing(tokens, gen)
                x = torch.randn(tokens, HIDDEN, generator=gen).to(act)
                start = time.perf_counter()
                moe_experts(x, ids, w.to(act), gate_up, down)
                if run:
                    times.append(time.perf_counter() - start)
                    distinct.append(len(set(ids.reshape(-1).tolist())))
            layer = statistics.median(times)
            used = statistics.median(distinct)
            rows.append(
                {
                    "experts": fmt,
                    "activations": str(act).removeprefix("torch."),
                    "tokens": tokens,
                    "distinct": used,
                    "layer_ms": layer * 1e3,
                    "forward_s": layer * LAYERS,
                    "read_gb_s": used * expert_bytes(fmt) / layer / 1e9,
                }
            )
            print(rows[-1], flush=True)
        del gate_up, down
    return rows


def report(rows: list[dict[str, object]], runs: int) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION_START,
        "## Routed experts in host memory: the CPU side of one MoE layer (issue 40)",
        "",
        f"- date: {now}; commit {commit}",
        f"- nproc: {os.cpu_count()}, torch threads {torch.get_num_threads()}; CPU: {cpu_model()} "
        f"({torch.backends.cpu.get_cpu_capability()}); torch {torch.__version__}; load average at start: "
        + " ".join(f"{v:.1f}" for v in os.getloadavg()),
        "- `.venv/bin/python bench/host_experts_bench.py`: `kernels.moe.reference.moe_experts` (what "
        "`SparseMoe.host_forward` runs on the host) at Clover's shapes (256 experts, hidden 2048, width "
        f"512, top-8), random weights, uniform routing drawn afresh each run; median of {runs} runs "
        "after a warm-up",
        "- per forward = one layer x 40: an extrapolation from one layer, not a measured forward; the "
        "copies to and from a GPU, the rest of the forward and any GPU work are not in it",
        "",
        "| experts | activations | tokens | distinct experts | one layer | x 40 layers (per forward) "
        "| expert bytes read per s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['experts']} | {r['activations']} | {r['tokens']} | {r['distinct']:.0f} | "
            f"{r['layer_ms']:.1f} ms | {r['forward_s']:.2f} s | {r['read_gb_s']:.1f} GB/s |"
        )
    lines.append(SECTION_END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, help="replace (or append) this section in a Markdown file")
    args = parser.parse_args()
    text = report(measure(args.runs), args.runs)
    print(text)
    if args.out is not None:
        old = args.out.read_text() if args.out.exists() else ""
        pattern = re.compile(re.escape(SECTION_START) + r".*?" + re.escape(SECTION_END), re.S)
        new = (
            pattern.sub(lambda _: text, old)
            if pattern.search(old)
            else old.rstrip("\n") + "\n\n" + text + "\n"
        )
        args.out.write_text(new)


if __name__ == "__main__":
    main()
