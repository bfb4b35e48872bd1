"""The serving part of ``gpu_bench.py`` (issue 40): what batching buys at the model's real shapes.

1. Batched steps: B requests (B = ``--batch-sizes``), each at ``--context`` committed tokens of random
   state, one 32-token denoising pass each, run as one ``forward_packed``; beside it one request's
   pass alone, B passes one by one, and one request's pass over B x 32 tokens (the packed step's
   floor: the same tokens, no per-request work). On a GPU a pass of one request reads every weight
   it touches for 32 tokens; a packed step reads them once for all B requests' tokens.
2. ``BatchEngine`` end to end: N concurrent greedy calls (``--batch-levels``), each with its own
   random prompt, decoding ``--batch-new-tokens`` tokens with the stop token ignored: wall time,
   request forwards per second and per step. Random weights commit about one token per pass (no
   position is confident), so forwards per second is the figure; tokens/s follows at a real
   checkpoint's tokens per forward.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from gpu_model import random_context, step_ids
from gpu_timing import Budget, median_seconds, synchronize

from clover_agent.engine.batching import BatchEngine
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.engine import Engine
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.model.packed import Segment

#: Rows of K/V room each request's cache has past its context (a pass writes 32).
ROOM = 64


def _pass_ids(model: CloverModel, tokens: int, seed: int) -> torch.Tensor:
    """A denoising pass's ids: ordinary tokens, then a block of mask tokens."""
    ids = step_ids(model, "denoise_32", seed)
    if tokens == ids.shape[0]:
        return ids
    rest = torch.randint(
        10,
        min(model.config.vocab_size, 150_000),
        (tokens - ids.shape[0],),
        generator=torch.Generator(device=model.device).manual_seed(seed + 1),
        device=model.device,
    )
    return torch.cat([rest, ids])


def batched_steps(
    model: CloverModel, context: int, sizes: list[int], budget: Budget, repeats: int, free_bytes: int
) -> dict[str, Any]:
    """Milliseconds of a packed step of B requests' 32-token passes against one request's pass,
    B passes one by one and one pass over the same B x 32 tokens (module docstring, part 1)."""
    device, block = model.device, model.config.block_size
    per_cache = model.new_cache(context + ROOM).nbytes()
    largest = max(sizes)
    floor_cache = per_cache * (context + block * largest) // (context + ROOM)
    fitting = [b for b in sizes if b * per_cache + floor_cache < free_bytes]
    out: dict[str, Any] = {"context": context, "cache_bytes_per_request": per_cache, "rows": []}
    if len(fitting) < len(sizes):
        out["left_out"] = [b for b in sizes if b not in fitting]
    if not fitting:
        return out
    caches = [random_context(model, context, ROOM, seed=10 + i) for i in range(max(fitting))]
    ids = [_pass_ids(model, block, seed=100 + i) for i in range(max(fitting))]
    one_s, _ = median_seconds(
        lambda _: model(ids[0], caches[0], attention="block", logit_rows=block), [None], device,
        repeats=repeats, budget=budget,
    )  # fmt: skip
    out["one_ms"] = one_s * 1e3
    wide_cache = random_context(model, context, block * max(fitting), seed=9)
    for size in fitting:
        if not budget.allows(f"batched step of {size} requests"):
            break
        segments = [Segment(ids[i], caches[i], "block", logit_rows=block) for i in range(size)]
        packed_s, calls = median_seconds(
            lambda _, s=segments: model.forward_packed(s), [None], device, repeats=repeats, budget=budget
        )

        def one_by_one(_: object, size: int = size) -> None:
            for i in range(size):
                model(ids[i], caches[i], attention="block", logit_rows=block)

        single_s, _ = median_seconds(one_by_one, [None], device, repeats=repeats, budget=budget)
        wide = _pass_ids(model, block * size, seed=7)
        floor_s, _ = median_seconds(
            lambda _, w=wide, n=block * size: model(w, wide_cache, attention="block", logit_rows=n),
            [None], device, repeats=repeats, budget=budget,
        )  # fmt: skip
        out["rows"].append(
            {
                "requests": size,
                "packed_ms": packed_s * 1e3,
                "one_by_one_ms": single_s * 1e3,
                "floor_ms": floor_s * 1e3,
                "passes_per_s": size / packed_s,
                # how much more pass work per unit of time than one request alone
                "vs_one": size * one_s / packed_s,
                "timed_calls": calls,
            }
        )
    return out


def batch_engine_decode(
    model: CloverModel, levels: list[int], prompt_tokens: int, new_tokens: int, budget: Budget
) -> dict[str, Any]:
    """N concurrent greedy calls through ``BatchEngine`` for each N of ``levels`` (module docstring,
    part 2)."""
    engine = Engine(model, model.config, None, model_dir=Path("<random weights>"), cuda_graphs=False)
    params = engine.default_params(max_new_tokens=new_tokens, ignore_eos=True)
    high = min(model.config.vocab_size, 150_000)
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "rows": []}
    for count in levels:
        if not budget.allows(f"BatchEngine with {count} requests"):
            break
        prompts = [
            torch.randint(
                10, high, (prompt_tokens,), generator=torch.Generator().manual_seed(50 + i)
            ).tolist()
            for i in range(count)
        ]
        batch = BatchEngine(engine, max_running=count, max_queued=count, prefix_cache=PrefixCache())
        try:
            synchronize(model.device)
            start = time.perf_counter()
            results = [r.result() for r in [batch.submit(p, params) for p in prompts]]
            synchronize(model.device)
            wall = time.perf_counter() - start
            stats = batch.stats()
        finally:
            batch.close()
        tokens = sum(len(r.token_ids) for r in results)
        out["rows"].append(
            {
                "requests": count,
                "wall_s": wall,
                "tokens": tokens,
                "tokens_per_s": tokens / wall,
                "forwards": stats.forwards,
                "steps": stats.steps,
                "forwards_per_s": stats.forwards / wall,
                "forwards_per_step": stats.forwards_per_step,
                "tokens_per_forward": tokens / stats.forwards if stats.forwards else 0.0,
            }
        )
    if out["rows"] and out["rows"][0]["requests"] == 1:
        base = out["rows"][0]["forwards_per_s"]
        for row in out["rows"]:
            row["vs_one"] = row["forwards_per_s"] / base
    return out
