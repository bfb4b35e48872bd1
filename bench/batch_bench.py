"""In-process ``BatchEngine`` throughput: N requests decoded together vs one, and a packed forward vs
the same forwards one by one.

Not a test; numbers go to bench/RESULTS.md. On a tiny random checkpoint (peaked logits, small
vocabulary, no stop token so every request decodes ``--new-tokens``), for N = 1, 2, 4, 8, 16
concurrent greedy diffusion requests it decodes the same pool of prompts (different lengths; as
many as the largest N), N running at a time and the rest queued, so every level does the same
work. It measures, in ``--repeats`` rounds over all levels (median per level):

- aggregate generated tokens/s (all requests' tokens over the level's wall time) and its ratio to
  N = 1 in the same run;
- per-request tokens/s (median over requests of tokens / its start-to-done time);
- tokens per CPU second of the process (all threads), and its ratio to N = 1: on CPUs shared
  with other work this moves less than wall time;
- forwards per step (requests sharing a packed step) and generated tokens per request forward.

``--forward`` adds the model alone, interleaved, median of ``--iterations``: one 32-token block
pass; 8 of them (8 requests) one by one, as one packed forward, and as two packed forwards of 4 on
two threads at once (a second core); and one block pass of a single request over the same 256
tokens, which has no per-request work at all: the packed forward's floor (when the two take the
same time, what is left is the arithmetic on 8x the tokens, which batching cannot share).

    .venv/bin/python bench/batch_bench.py                 # prints a Markdown table
    .venv/bin/python bench/batch_bench.py --forward --threads 1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from clover_agent.engine.batching import BatchEngine
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.model.packed import Segment


@dataclass(frozen=True)
class Level:
    requests: int
    wall_s: float
    cpu_s: float  # this process's CPU time (every thread) over the level
    tokens: int
    per_request: float  # median tokens/s of one request
    forwards_per_step: float
    tokens_per_forward: float

    @property
    def aggregate(self) -> float:
        return self.tokens / self.wall_s

    @property
    def per_cpu_second(self) -> float:
        """Tokens per CPU second of this process: less sensitive than wall time to other
        processes sharing the CPUs."""
        return self.tokens / self.cpu_s


def _prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [40 + (23 * i) % 90 for i in range(count)]  # 40 .. 129 tokens, some mid-block
    return [torch.randint(1, vocab, (n,), generator=generator).tolist() for n in lengths]


def run_level(
    engine: Engine, count: int, prompts: list[list[int]], new_tokens: int, packed: bool = True
) -> Level:
    """Every prompt of the pool, ``count`` running at a time (the rest queued)."""
    # A fresh prefix cache: a later round must not start from an earlier round's committed prompts.
    batch = BatchEngine(
        engine, max_running=count, max_queued=len(prompts), prefix_cache=PrefixCache(), packed=packed
    )
    params = engine.default_params(max_new_tokens=new_tokens)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        requests = [batch.submit(prompt, params) for prompt in prompts]
        results = [r.result() for r in requests]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        stats = batch.stats()
    finally:
        batch.close()
    tokens = sum(len(r.token_ids) for r in results)
    per_request = [
        len(res.token_ids) / (req.finished - req.started)
        for req, res in zip(requests, results, strict=True)
        if req.finished is not None and req.started is not None
    ]
    return Level(
        requests=count,
        wall_s=wall,
        cpu_s=cpu,
        tokens=tokens,
        per_request=statistics.median(per_request),
        forwards_per_step=stats.forwards_per_step,
        tokens_per_forward=tokens / stats.forwards if stats.forwards else 0.0,
    )


def forward_ratio(engine: Engine, iterations: int) -> dict[str, float]:
    """Median ms of: one 32-token block pass, 8 of them one by one, the same 8 as one packed forward,
    and one request's block pass over 256 tokens (the packed forward's floor)."""
    model = engine.model
    generator = torch.Generator().manual_seed(0)
    segments = []
    for i in range(8):
        cache = model.new_cache(512)
        prompt = torch.randint(1, 500, (64 + 32 * i,), generator=generator).tolist()
        model(prompt, cache, attention="block", commit=True, logit_rows=0)
        segments.append(
            Segment(torch.randint(1, 500, (32,), generator=generator).tolist(), cache, "block", logit_rows=32)
        )
    whole = model.new_cache(1024)
    model(torch.randint(1, 500, (160,), generator=generator).tolist(), whole, attention="block", commit=True)
    wide = torch.randint(1, 500, (256,), generator=generator).tolist()

    def one() -> None:
        s = segments[0]
        model(s.input_ids, s.cache, attention="block", logit_rows=32)

    def single() -> None:
        for s in segments:
            model(s.input_ids, s.cache, attention="block", logit_rows=32)

    def packed() -> None:
        model.forward_packed(segments)

    def floor() -> None:
        model(wide, whole, attention="block", logit_rows=256)

    pool = ThreadPoolExecutor(1)

    def split() -> None:  # the 8 as two packed forwards of 4, one on another thread (another core)
        other = pool.submit(model.forward_packed, segments[0::2])
        model.forward_packed(segments[1::2])
        other.result()

    runs = {"one": one, "single": single, "packed": packed, "floor": floor, "split": split}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():  # warm up
        fn()
    for _ in range(iterations):  # interleaved: all see the same machine
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    pool.shutdown()
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pool", type=int, default=0, help="prompts decoded at every level (default: the largest N)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (tiny tensors: 1)")
    parser.add_argument(
        "--forward", action="store_true", help="also time a packed forward against single ones"
    )
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument(
        "--no-packed", action="store_true", help="steps as a loop of forwards (BatchEngine(packed=False))"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    folder = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    path = write_tiny_checkpoint(
        folder / "tiny", peaked=True, seed=3, tokenizer=False, overrides={"eos_token_id": []}
    )
    engine = Engine.from_pretrained(path, progress=None)
    levels = [int(n) for n in args.levels.split(",")]
    prompts = _prompts(args.pool or max(levels), engine.config.mask_token_id or 500, seed=0)
    print(
        f"- {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {_commit()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); tiny checkpoint (peaked, small "
        f"vocabulary), greedy diffusion, {len(prompts)} prompts of {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens, {args.new_tokens} new tokens each, median of {args.repeats}"
        f"{', steps as loops of forwards (--no-packed)' if args.no_packed else ''}"
    )
    if args.forward:
        ms = forward_ratio(engine, args.iterations)
        print(
            f"- one 32-token block pass {ms['one']:.2f} ms; 8 requests' passes one by one "
            f"{ms['single']:.2f} ms, packed {ms['packed']:.2f} ms ({ms['single'] / ms['packed']:.2f}x; "
            f"{8 * ms['one'] / ms['packed']:.2f}x the work of one pass per unit of time); one request's "
            f"256-token pass (the floor: no per-request work) {ms['floor']:.2f} ms; the 8 as two packed "
            f"forwards of 4 on two threads at once {ms['split']:.2f} ms; median of {args.iterations} "
            "interleaved"
        )
    print()
    print(
        "| N | aggregate tok/s | vs N=1 | tok per CPU-s | vs N=1 | per-request tok/s | forwards per step "
        "| tokens per forward |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    runs: dict[int, list[Level]] = {count: [] for count in levels}
    for _ in range(args.repeats):  # rounds over every level: a busy moment hits all levels alike
        for count in levels:
            runs[count].append(run_level(engine, count, prompts, args.new_tokens, packed=not args.no_packed))
    base: tuple[float, float] | None = None
    for count in levels:
        level = sorted(runs[count], key=lambda lv: lv.aggregate)[len(runs[count]) // 2]
        per_cpu = statistics.median(lv.per_cpu_second for lv in runs[count])
        base = base if base is not None else (level.aggregate, per_cpu)
        print(
            f"| {count} | {level.aggregate:.0f} | {level.aggregate / base[0]:.2f}x | {per_cpu:.0f} | "
            f"{per_cpu / base[1]:.2f}x | {level.per_request:.0f} | {level.forwards_per_step:.1f} | "
            f"{level.tokens_per_forward:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
