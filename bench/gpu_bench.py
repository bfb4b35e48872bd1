"""One prepared engine benchmark for a short session on a bare GPU machine (under 8 minutes).

    python3 bench/gpu_bench.py --time-budget 420 --out $OUT/gpu_bench.json     # on the device
    .venv/bin/python bench/gpu_bench.py --device cpu --shape tiny --time-budget 60  # anywhere

It needs nothing installed beyond torch (and triton for Triton kernels): it imports the engine
from the tree it sits in (:func:`use_source_tree`), so a copy of the working tree runs as it is,
and it downloads nothing. Measured in one run, each piece skipped (and named) once
``--time-budget`` is spent, each failure recorded without ending the run (exit status 1):

1. copy bandwidth (device to device, bytes read + written), the yardstick of everything below;
2. each Triton kernel (``clover_agent.kernels``) at the model's 32- and 64-token step shapes and a
   4,096-token prefill, against its PyTorch reference in the run's dtype (relative error and
   bound), timed with CUDA events (median over rotating inputs), its minimum traffic in GB/s and as
   a share of the copy bandwidth (``gpu_kernels.py``);
3. the model at ``--shape`` (``full``: engine/model/configs/clover-35b-a3b.json, 40 layers, 256 experts
   top-8, vocabulary 248,320) with random weights built on the device (``--model DIR``: a real
   checkpoint instead), and its decoding steps at ``--context`` committed tokens: denoise 32,
   commit 32, commit fused with the next denoise (64), verify 64 and one autoregressive token;
   time, bytes touched (routed experts as the step's tokens route), memory floor and time over
   floor, ATen operators and CUDA kernels per step, and the steps replayed as CUDA graphs
   (``gpu_model.py``);
4. an end-to-end greedy decode per mode (wall time per forward; with a real checkpoint, the
   measured tokens per forward) and tokens/s of each mode from the step times at those tokens per
   forward and at ``--tokens-per-forward``;
5. what batching buys (issue 40, ``gpu_batch.py``): packed steps of 1-16 requests' passes against one
   request's, and N concurrent calls through ``BatchEngine`` (``--batch-sizes``, ``--batch-levels``);
6. the routed experts quantised in place, FP8 (e4m3, 128 x 128 block scales) then INT4 (w4a16,
   groups of 128; ``--experts``), and the steps of 3 timed again on those kernels, with their
   tokens/s beside the run's dtype;
7. prompt prefill tokens/s (``--prefill-tokens``) with the model's kernels and with the PyTorch
   operators side by side, and the agent's path: two turns of one conversation on one decoder as the
   agent's engine backend builds it (``--agent-prompt-tokens`` then ``--agent-new-tokens``; CUDA
   graphs captured once on its workspace): time to the first block, decoding tokens/s, what the
   second turn reused (``gpu_agent.py``).

The run is labelled with ``--commit`` (what the caller checked out; default: the tree's git HEAD,
which a bare copy of the working tree lacks). Random weights say nothing about tokens per forward: the report says which figures are measured.
Full results go to ``--out`` (JSON; the path is printed), a Markdown section for bench/RESULTS.md
to stdout (``gpu_report.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def use_source_tree() -> None:
    """Import ``clover_agent`` from this tree, installed or not: the repository root first on the
    path, and the root on the package's path too, so ``engine/`` and ``kernels/`` are its
    subpackages even in a copy of the tree that lost the links ``clover_agent/<name>``."""
    sys.path.insert(0, str(ROOT))
    import clover_agent

    if str(ROOT) not in clover_agent.__path__:
        clover_agent.__path__.append(str(ROOT))


use_source_tree()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from gpu_agent import agent_path, prefill  # noqa: E402
from gpu_batch import batch_engine_decode, batched_steps  # noqa: E402
from gpu_kernels import check_kernels, kernel_input_bytes  # noqa: E402
from gpu_model import mode_rates, quantize_experts, random_model, time_steps  # noqa: E402
from gpu_report import markdown  # noqa: E402
from gpu_timing import Budget, copy_bandwidth, synchronize  # noqa: E402

import clover_agent.engine.engine as engine_module  # noqa: E402
from clover_agent.engine.decoding.decoder import BlockDecoder  # noqa: E402
from clover_agent.engine.decoding.sampling import MODES, SamplingParams  # noqa: E402
from clover_agent.engine.engine import Engine  # noqa: E402
from clover_agent.engine.loading.locate import ModelSources, locate_model  # noqa: E402
from clover_agent.engine.loading.tiny import TINY_TEXT_CONFIG  # noqa: E402
from clover_agent.engine.model.config import CloverConfig, full_size_config_json  # noqa: E402
from clover_agent.engine.model.network import CloverModel  # noqa: E402

CODE_PROMPT = (
    "def merge_intervals(intervals):\n"
    '    """Merge overlapping [start, end] intervals and return them sorted."""\n'
)


def shape_config(shape: str) -> CloverConfig:
    """``full``: the shipped Clover config; ``tiny``: its contract and vocabulary size with the tiny
    test model's layer sizes (a CPU run of the whole script in seconds)."""
    config = CloverConfig.from_dict(full_size_config_json())
    if shape == "full":
        return config
    sizes = {k: v for k, v in TINY_TEXT_CONFIG.items() if k in CloverConfig.__dataclass_fields__}
    layers = sizes["num_hidden_layers"]
    kinds = tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers))
    return config.with_overrides(**sizes, layer_types=kinds)


def git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        )
    except OSError:
        return "unknown (no git)"
    return result.stdout.strip() or "unknown (not a git checkout)"


def machine(device: torch.device, commit: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "commit": commit or git_commit(),
        "source": str(Path(engine_module.__file__ or "").resolve().parent),
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    return info


def attempt(report: dict[str, Any], key: str, run: Callable[[], Any]) -> Any:
    """Run one piece and store its result under ``key``; an exception is recorded under
    ``errors`` (its traceback under ``tracebacks``) and the run goes on."""
    try:
        value = run()
    except Exception as exc:
        report["errors"].append(f"{key}: {type(exc).__name__}: {exc}")
        report.setdefault("tracebacks", {})[key] = traceback.format_exc()
        return None
    report[key] = value
    return value


def free_memory(device: torch.device, limit_gb: float | None) -> int:
    """Bytes a piece may allocate: what the device has free (host: MemAvailable), capped by
    ``--memory-limit-gb``."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
        except OSError:
            pass
    return free if limit_gb is None else min(free, int(limit_gb * 1e9))


def check_fits(what: str, need: int, device: torch.device, limit_gb: float | None) -> None:
    free = free_memory(device, limit_gb)
    if need > free:
        raise MemoryError(
            f"{what} would take about {need / 1e9:.1f} GB on {device}; {free / 1e9:.1f} GB may be used"
        )


def model_info(model: CloverModel, dtype: torch.dtype, seconds: float) -> dict[str, Any]:
    config, device = model.config, model.device
    info: dict[str, Any] = {
        "build_s": seconds,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "operators": model.ops.backends,
        "shape": {
            "layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "experts": config.num_experts,
            "experts_per_token": config.num_experts_per_tok,
            "vocab_size": config.vocab_size,
            "block_size": config.block_size,
        },
    }
    if device.type == "cuda":
        info["cuda_allocated_gib"] = torch.cuda.memory_allocated(device) / 2**30
    return info


def build_model(
    config: CloverConfig, device: torch.device, dtype: torch.dtype, limit_gb: float | None
) -> tuple[CloverModel, dict[str, Any]]:
    """The random-weight model, after checking that it fits the memory it may use."""
    with torch.device("meta"):
        parameters = sum(p.numel() for p in CloverModel(config).parameters())
    need = int(parameters * torch.empty((), dtype=dtype).element_size() * 1.1)
    check_fits(f"the {config.num_hidden_layers}-layer model", need, device, limit_gb)
    start = time.perf_counter()
    model = random_model(config, device, dtype)
    synchronize(device)
    return model, {**model_info(model, dtype, time.perf_counter() - start), "source": "random"}


def measure_kernels(config: CloverConfig, device: torch.device, dtype: torch.dtype, **kwargs: Any) -> Any:
    """:func:`check_kernels`, after checking that their inputs fit the memory they may use."""
    limit = kwargs.pop("limit_gb")
    check_fits("the kernel inputs", kernel_input_bytes(config, dtype), device, limit)
    return check_kernels(config, device, dtype, **kwargs)


def load_weights(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> tuple[Engine, dict[str, Any]]:
    """The checkpoint ``--model`` names, loaded as the engine loads it."""
    location = locate_model(ModelSources(explicit=args.model))
    if location.path is None:
        raise FileNotFoundError(f"--model {args.model}: no checkpoint there. {location.describe().strip()}")
    start = time.perf_counter()
    engine = Engine.from_pretrained(location.path, device=device, dtype=dtype, progress=None)
    synchronize(device)
    info = model_info(engine.model, dtype, time.perf_counter() - start)
    return engine, {**info, "source": "weights", "path": str(location.path)}


def decode_prompt(decoder: BlockDecoder) -> list[int]:
    if decoder.tokenizer is not None:
        return decoder.tokenizer.encode(CODE_PROMPT)
    high = min(decoder.config.vocab_size, 150_000)
    return torch.randint(10, high, (40,), generator=torch.Generator().manual_seed(7)).tolist()


def end_to_end(decoder: BlockDecoder, new_tokens: int, budget: Budget) -> dict[str, dict[str, Any]]:
    """Greedy decoding in each mode, no stop token: wall time per forward, tokens per forward; on
    CUDA again with the steps replayed as CUDA graphs (their tokens may differ from eager ones
    where random weights leave near-ties: the graph steps' attention rounds otherwise)."""
    prompt = decode_prompt(decoder)
    graphed = None
    if decoder.device.type == "cuda":
        graphed = BlockDecoder(decoder.model, decoder.tokenizer, cuda_graphs=True)
        decoder = BlockDecoder(decoder.model, decoder.tokenizer)  # eager, whatever the engine's default
    out: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        if not budget.allows(f"decode {mode}"):
            continue
        params = SamplingParams.for_model(
            decoder.config, max_new_tokens=new_tokens, mode=mode, stop_token_ids=()
        )
        result = decoder.generate(prompt, params)
        row = out[mode] = {
            "tokens": len(result.token_ids),
            "forwards": result.forwards,
            "seconds": result.seconds,
            "ms_per_forward": result.seconds / result.forwards * 1e3,
            "tokens_per_forward": result.tokens_per_forward,
            "tokens_per_s": len(result.token_ids) / result.seconds,
        }
        if graphed is not None and budget.allows(f"decode {mode} with CUDA graphs"):
            try:
                with_graphs = graphed.generate(prompt, params)
            except Exception as exc:
                row["graph_error"] = f"{type(exc).__name__}: {exc}"
                continue
            row["graph_tokens_per_s"] = len(with_graphs.token_ids) / with_graphs.seconds
            row["graph_same_tokens"] = with_graphs.token_ids == result.token_ids
    return out


def tune_moe(config: CloverConfig, device: torch.device, dtype: torch.dtype, args: argparse.Namespace) -> Any:
    """The expert GEMMs' tiles tuned at the decoding steps' token counts (``kernels/moe/tune.py``),
    written to ``moe_tiles.json`` beside ``--out``: the table to ship for this GPU model."""
    from gpu_kernels import kernel_sizes

    from clover_agent.kernels.moe.tiles import write_table
    from clover_agent.kernels.moe.tune import tune

    problems, rows = tune(
        sizes=kernel_sizes(config),
        tokens=(32, 64),
        quants=args.tune_moe,
        dtype=dtype,
        device=device,
        repeats=5,
    )
    table = args.out.with_name("moe_tiles.json")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    write_table(table, name, problems, {"torch": torch.__version__, "space": "small"})
    return {"table": str(table), "rows": rows}


def run(args: argparse.Namespace) -> dict[str, Any]:
    budget = Budget(args.time_budget)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    settings = {**vars(args), "out": str(args.out)}
    report: dict[str, Any] = {"machine": machine(device, args.commit), "settings": settings, "errors": []}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if budget.allows("copy bandwidth"):
        attempt(
            report,
            "copy_bandwidth",
            lambda: copy_bandwidth(device, 2048 if device.type == "cuda" else 64, budget),
        )
    bandwidth = report["copy_bandwidth"]["gb_per_s"] * 1e9 if "copy_bandwidth" in report else None
    engine: Engine | None = None
    if args.model:
        loaded = attempt(report, "model", lambda: load_weights(args, device, dtype))
        if loaded is None:
            return finish(report, device, budget)
        engine, report["model"] = loaded
        config = engine.config
    else:
        config = shape_config(args.shape)
    if budget.allows("kernels"):
        attempt(
            report,
            "kernels",
            lambda: measure_kernels(
                config,
                device,
                dtype,
                context=args.context,
                bandwidth=bandwidth,
                budget=budget,
                repeats=args.repeats,
                limit_gb=args.memory_limit_gb,
            ),
        )
    if engine is not None:
        model, decoder = engine.model, engine.decoder
    else:
        built = (
            attempt(report, "model", lambda: build_model(config, device, dtype, args.memory_limit_gb))
            if budget.allows("model")
            else None
        )
        if built is None:
            return finish(report, device, budget)
        model, report["model"] = built
        decoder = BlockDecoder(model)
    if budget.allows("steps"):
        attempt(
            report,
            "steps",
            lambda: time_steps(model, args.context, bandwidth=bandwidth, budget=budget, repeats=args.repeats),
        )
    if budget.allows("decode"):
        attempt(report, "decode", lambda: end_to_end(decoder, args.decode_tokens, budget))
    if args.batch_sizes and budget.allows("batched steps"):
        attempt(
            report,
            "batched_steps",
            lambda: batched_steps(
                model,
                args.context,
                args.batch_sizes,
                budget,
                args.repeats,
                free_memory(device, args.memory_limit_gb),
            ),
        )
    if args.batch_levels and budget.allows("BatchEngine"):
        attempt(
            report,
            "batch_engine",
            lambda: batch_engine_decode(
                model, args.batch_levels, args.batch_prompt_tokens, args.batch_new_tokens, budget
            ),
        )
    if args.tune_moe and budget.allows("MoE tile tuning"):
        attempt(report, "moe_tiles", lambda: tune_moe(config, device, dtype, args))
    if args.prefill_tokens and budget.allows("prefill"):
        attempt(report, "prefill", lambda: prefill(model, args.prefill_tokens, budget, min(args.repeats, 3)))
    if args.agent_prompt_tokens and budget.allows("agent path"):
        attempt(
            report,
            "agent_path",
            lambda: agent_path(
                model,
                decoder.tokenizer,
                prompt_tokens=args.agent_prompt_tokens,
                new_tokens=args.agent_new_tokens,
                budget=budget,
            ),
        )
    rates = list(args.tokens_per_forward)
    report["tokens_per_forward_source"] = "given (--tokens-per-forward): random weights measure none"
    if engine is not None and "diffusion" in report.get("decode", {}):
        measured = round(report["decode"]["diffusion"]["tokens_per_forward"], 2)
        rates = [measured, *rates]
        report["tokens_per_forward_source"] = (
            f"measured ({measured}, this checkpoint's diffusion decode), then given"
        )
    if report.get("steps"):
        report["mode_rates"] = mode_rates(report["steps"], rates, config.block_size)
    for scheme in args.experts:
        if not budget.allows(f"steps with {scheme} experts"):
            continue
        if (
            attempt(report, f"experts_{scheme}", lambda scheme=scheme: quantize_experts(model, scheme))
            is None
        ):
            break  # the model's experts are half-replaced: nothing after this measures what it says
        steps = attempt(
            report,
            f"steps_{scheme}",
            lambda: time_steps(model, args.context, bandwidth=bandwidth, budget=budget, repeats=args.repeats),
        )
        if steps:
            report[f"mode_rates_{scheme}"] = mode_rates(steps, rates, config.block_size)
    return finish(report, device, budget)


def finish(report: dict[str, Any], device: torch.device, budget: Budget) -> dict[str, Any]:
    if device.type == "cuda":
        report["cuda_peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report["budget"] = {"seconds": budget.seconds, "used_s": budget.used()}
    report["skipped"] = budget.skipped
    return report


def number_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part]


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), help="default: bfloat16 on CUDA, float32 on the CPU"
    )
    parser.add_argument(
        "--shape", choices=("full", "tiny"), help="random model's shape (default: full on CUDA, else tiny)"
    )
    parser.add_argument("--model", help="a checkpoint folder to measure instead of random weights")
    parser.add_argument(
        "--context", type=int, default=4096, help="committed tokens before each step (default 4096)"
    )
    parser.add_argument(
        "--time-budget", type=float, default=420.0, help="seconds for the whole run (default 420)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per measurement (default 10)")
    parser.add_argument(
        "--decode-tokens", type=int, default=64, help="tokens per end-to-end decode (default 64)"
    )
    parser.add_argument("--tokens-per-forward", type=number_list, default=[1.0, 2.0, 3.0, 4.0, 6.0])
    parser.add_argument(
        "--experts",
        type=lambda text: [s for s in text.split(",") if s],
        default=["fp8", "int4"],
        help="quantised routed experts timed after the run's dtype, in order (default fp8,int4; '' for none)",
    )
    parser.add_argument(
        "--prefill-tokens",
        type=int,
        help="prompt tokens of the prefill timing (default 16384 on CUDA, else 512; 0: none)",
    )
    parser.add_argument(
        "--agent-prompt-tokens",
        type=int,
        help="the agent path's first prompt (default 20000 on CUDA, else 300; 0: no agent path)",
    )
    parser.add_argument(
        "--agent-new-tokens", type=int, help="tokens its first turn decodes (default 8192 on CUDA, else 64)"
    )
    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=[1, 2, 4, 8, 16],
        help="requests per packed step timed (default 1,2,4,8,16; '' for none)",
    )
    parser.add_argument(
        "--batch-levels",
        type=int_list,
        default=[1, 8],
        help="concurrent calls decoded through BatchEngine (default 1,8; '' for none)",
    )
    parser.add_argument(
        "--batch-prompt-tokens",
        type=int,
        help="each BatchEngine call's prompt (default 2048 on CUDA, else 64)",
    )
    parser.add_argument(
        "--batch-new-tokens",
        type=int,
        help="tokens each BatchEngine call decodes (default 256 on CUDA, else 16)",
    )
    parser.add_argument(
        "--tune-moe",
        type=lambda text: [s for s in text.split(",") if s],
        default=[],
        help="tune the expert GEMMs' tiles for these weight formats (none,fp8,int4) at the decoding "
        "steps' token counts and write the table beside --out (default: no tuning; it compiles "
        "dozens of variants)",
    )
    parser.add_argument("--commit", help="the commit this tree is, for the report (default: git HEAD)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--memory-limit-gb", type=float, help="refuse pieces that need more memory (default: what is free)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu_bench.json"))
    args = parser.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not cuda:
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    args.dtype = args.dtype or ("bfloat16" if on_cuda else "float32")
    args.shape = args.shape or ("full" if on_cuda else "tiny")
    for name, on_gpu, elsewhere in (
        ("prefill_tokens", 16384, 512),
        ("agent_prompt_tokens", 20000, 300),
        ("agent_new_tokens", 8192, 64),
        ("batch_prompt_tokens", 2048, 64),
        ("batch_new_tokens", 256, 16),
    ):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if on_cuda else elsewhere)
    if args.repeats < 1 or args.context < 0 or args.context % 32:
        parser.error("--repeats must be >= 1 and --context a multiple of 32")
    if not set(args.experts) <= {"fp8", "int4"}:
        parser.error("--experts takes fp8 and int4, comma-separated")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(markdown(report))
    print(f"full results: {args.out.resolve()}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
