"""Measure the grouped expert GEMMs' tile shapes on this GPU and write the fastest into a table.

    python -m clover_agent.kernels.moe.tune --out kernels/moe/tuned/$(name).json      # on a GPU

For each weight format (``--quant``) and token count (``--tokens``), every candidate :class:`Tiles`
of the search space runs ``routed_pairs`` (both GEMMs) on random inputs routed as a real model's
are; a candidate whose output strays from the heuristic tiles' output is dropped (named in the
report), the rest are timed (median of CUDA-event times; the wall clock elsewhere) and the fastest
is kept. The table is merged into ``--out``; ``tiles.tiles_for`` reads it (``CLOVER_MOE_TILES`` or
the shipped file of the GPU's model). Runs under the Triton interpreter too, on tiny sizes, where
only the mechanism is checked: its times mean nothing there.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from clover_agent.kernels.bench import CLOVER, CloverSizes, median_seconds, relative_error
from clover_agent.kernels.moe.tiles import Tiles, block_m_for, problem_key, write_table

#: Token counts measured by default: a decoding block, the fused 64-token step, prefill chunks.
TOKENS = (32, 64, 1024, 4096)
#: Largest relative difference from the heuristic tiles' output a candidate may show (the sums
#: run in another order; a wrong tile shows O(1)).
AGREEMENT = 2e-2


def search_space(tokens: int, top_k: int, experts: int, size: str = "small") -> list[Tiles]:
    """Candidates for ``tokens`` tokens: tile heights around the pairs an expert gets (16 for a
    decoding step), widths, K steps, warps and pipeline stages; ``"full"`` widens each."""
    per_expert = tokens * top_k / experts
    heights = [16] if per_expert <= 16 else [32, 64, 128] if size == "full" else [32, 64]
    widths = [32, 64, 128, 256] if size == "full" else [64, 128]
    depths = [32, 64, 128] if size == "full" else [64, 128]
    warps = [4, 8]
    stages = [2, 3, 4, 5] if size == "full" else [3, 4]
    return [
        Tiles(m, n, k, w, s) for m, n, k, w, s in itertools.product(heights, widths, depths, warps, stages)
    ]


def _problem(
    tokens: int, sizes: CloverSizes, quant: str, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    from clover_agent.kernels.moe.quant import quantize

    gen = torch.Generator(device=device).manual_seed(tokens)
    e, h, i = sizes.experts, sizes.hidden, sizes.moe_inner
    gate_up = (torch.randn(e, 2 * i, h, generator=gen, device=device) * h**-0.5).to(dtype)
    down = (torch.randn(e, h, i, generator=gen, device=device) * i**-0.5).to(dtype)
    if quant != "none":
        gate_up, down = quantize(gate_up, quant, halves=2), quantize(down, quant)
    logits = torch.randn(tokens, e, generator=gen, device=device)
    weights, ids = torch.softmax(logits, dim=-1).topk(sizes.top_k, dim=-1)
    return {
        "x": torch.randn(tokens, h, generator=gen, device=device).to(dtype),
        "expert_ids": ids,
        "expert_weights": (weights / weights.sum(-1, keepdim=True)).to(dtype),
        "gate_up_proj": gate_up,
        "down_proj": down,
    }


def tune(
    *,
    sizes: CloverSizes = CLOVER,
    tokens: Sequence[int] = TOKENS,
    quants: Sequence[str] = ("none", "fp8", "int4"),
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cuda",
    size: str = "small",
    space: Callable[[int], list[Tiles]] | None = None,
    repeats: int = 10,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict[int, Tiles]], list[dict[str, Any]]]:
    """(problems for :func:`write_table`, one report row per (format, token count))."""
    from clover_agent.kernels.moe.fused_moe import routed_pairs

    device = torch.device(device)
    timing = functools.partial(median_seconds, warmup=1, repeats=repeats, cuda=device.type == "cuda")
    problems: dict[str, dict[int, Tiles]] = {}
    rows: list[dict[str, Any]] = []
    for quant, count in itertools.product(quants, tokens):
        args = _problem(count, sizes, quant, dtype, device)
        default = Tiles(block_m_for(count * sizes.top_k, sizes.experts))
        expected = routed_pairs(**args, tiles=default)
        candidates = space(count) if space else search_space(count, sizes.top_k, sizes.experts, size)
        timed: dict[Tiles, float] = {}
        dropped: dict[str, str] = {}
        for tiles in candidates:
            try:
                error = relative_error(routed_pairs(**args, tiles=tiles), expected)
                if error > AGREEMENT:
                    dropped[str(asdict(tiles))] = f"differs by {error:.1e}"
                    continue
                timed[tiles] = timing(functools.partial(routed_pairs, **args, tiles=tiles))
            except Exception as exc:  # a shape this GPU cannot run (shared memory, registers)
                dropped[str(asdict(tiles))] = f"{type(exc).__name__}: {str(exc)[:200]}"
        default_s = timing(functools.partial(routed_pairs, **args, tiles=default))
        if not timed:
            rows.append({"quant": quant, "tokens": count, "error": "no candidate ran", "dropped": dropped})
            continue
        best = min(timed, key=timed.__getitem__)
        key = problem_key(sizes.experts, sizes.hidden, sizes.moe_inner, sizes.top_k, dtype, quant)
        problems.setdefault(key, {})[count] = best
        rows.append(
            {
                "quant": quant,
                "tokens": count,
                "best": asdict(best),
                "best_ms": timed[best] * 1e3,
                "default": asdict(default),
                "default_ms": default_s * 1e3,
                "speedup": default_s / timed[best],
                "candidates": len(candidates),
                "dropped": dropped,
            }
        )
        if progress:
            progress(
                f"{quant} {count} tokens: {asdict(best)} {timed[best] * 1e3:.3f} ms ({default_s / timed[best]:.2f}x)"
            )
    return problems, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clover_agent.kernels.moe.tune", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the table to write (merged into)")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--quant", default="none,fp8,int4")
    parser.add_argument("--space", choices=("small", "full"), default="small")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tuning needs a CUDA GPU (the interpreter's times mean nothing)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    problems, rows = tune(
        tokens=[int(t) for t in args.tokens.split(",")],
        quants=[q for q in args.quant.split(",") if q],
        device=device,
        size=args.space,
        repeats=args.repeats,
        progress=lambda line: print(line, file=sys.stderr),
    )
    name = torch.cuda.get_device_name(device)
    write_table(args.out, name, problems, {"torch": torch.__version__, "space": args.space})
    for row in rows:
        print(row)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
