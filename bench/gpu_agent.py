"""The agent's part of ``gpu_bench.py``: prompt prefill throughput (the model's kernels beside the
plain-PyTorch operators, in the same run) and the agent's decoding path, two turns of one
conversation on one decoder as the agent's engine backend builds it (prefix cache, CUDA graphs on a
CUDA device, captured on the decoder's workspace): time to the first committed block, decoding
tokens/s after it, and what the second turn reused (prompt state, captured graphs).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from gpu_timing import Budget, synchronize

from clover_agent.engine.decoding.decoder import PREFILL_CHUNK_TOKENS, BlockDecoder
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.ops import resolve_ops
from clover_agent.engine.text.tokenizer import Tokenizer


@contextmanager
def operators(model: CloverModel, kernels: str) -> Iterator[str]:
    """``model`` running ``kernels`` ("torch": every operator's PyTorch version) inside the block;
    yields the operators' backends in words."""
    device = model.device
    saved = model.ops
    model._ops[device] = resolve_ops(kernels, device)
    try:
        yield ", ".join(sorted(set(model.ops.backends.values())))
    finally:
        model._ops[device] = saved


def random_ids(model: CloverModel, count: int, seed: int) -> list[int]:
    high = min(model.config.vocab_size, 150_000)
    return torch.randint(10, high, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill_seconds(model: CloverModel, ids: list[int]) -> float:
    """Wall time of committing ``ids`` to an empty cache in the decoder's prefill chunks."""
    device = model.device
    chunk = PREFILL_CHUNK_TOKENS
    tensor = torch.tensor(ids, device=device)
    cache = model.new_cache(len(ids))
    synchronize(device)
    start = time.perf_counter()
    for begin in range(0, len(ids), chunk):
        model(tensor[begin : begin + chunk], cache, attention="block", commit=True, logit_rows=0)
    synchronize(device)
    return time.perf_counter() - start


def prefill(model: CloverModel, tokens: int, budget: Budget, repeats: int) -> dict[str, Any]:
    """Prefill tokens/s of a ``tokens``-token prompt (block-aligned), median of up to ``repeats``
    runs after one warm-up, with the model's operators and then with the PyTorch ones."""
    tokens = max(model.config.block_size, tokens // model.config.block_size * model.config.block_size)
    ids = random_ids(model, tokens, seed=3)
    out: dict[str, Any] = {"tokens": tokens, "chunk": PREFILL_CHUNK_TOKENS}
    for label, kernels in (("model", model.kernels), ("torch_reference", "torch")):
        if not budget.allows(f"prefill with {label} operators"):
            continue
        with operators(model, kernels) as backends:
            prefill_seconds(model, ids)  # warm-up: compilation, autotuning, workspaces
            times = []
            for _ in range(repeats):
                times.append(prefill_seconds(model, ids))
                if budget.left() <= 0:
                    break
        seconds = sorted(times)[len(times) // 2]
        out[label] = {
            "operators": backends,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "runs": len(times),
        }
    if "model" in out and "torch_reference" in out:
        out["speedup"] = out["torch_reference"]["seconds"] / out["model"]["seconds"]
    return out


def _turn(
    decoder: BlockDecoder, prompt: list[int], params: SamplingParams, seconds: float
) -> tuple[dict[str, Any], list[int]]:
    """One call, consumed as the agent does (a stream), stopped after ``seconds`` of decoding: its
    figures and the tokens it committed."""
    synchronize(decoder.device)
    start = time.perf_counter()
    first: float | None = None
    generated: list[int] = []
    result = None
    for event in decoder.stream(prompt, params):
        if isinstance(event, BlockCommitted):
            generated += event.token_ids
            if first is None:
                first = time.perf_counter() - start
            elif time.perf_counter() - start - first > seconds:
                break
        elif isinstance(event, GenerationDone):
            result = event.result
    synchronize(decoder.device)
    total = time.perf_counter() - start
    graphs = decoder.step_graphs
    tokens = len(generated)
    row: dict[str, Any] = {
        "prompt_tokens": len(prompt),
        "tokens": tokens,
        "first_block_s": first,
        "seconds": total,
        "finished": result.finish_reason if result is not None else "stopped by the time cap",
    }
    if first is not None and tokens > params.block_size:
        row["decode_tokens_per_s"] = (tokens - params.block_size) / (total - first)
    if result is not None:
        row.update(reused_tokens=result.reused_tokens, tokens_per_forward=result.tokens_per_forward)
    if graphs is not None:
        row.update(
            graph_captures=graphs.captures,
            graph_replays=graphs.replays,
            # denoising passes replayed with their token choice in the graph (ChoiceProgram)
            graph_pass_replays=sum(n for key, n in graphs.replayed.items() if isinstance(key, tuple)),
            graph_failures={str(key): why for key, why in graphs.failed.items()},
        )
    return row, generated


def agent_path(
    model: CloverModel,
    tokenizer: Tokenizer | None,
    *,
    prompt_tokens: int,
    new_tokens: int,
    budget: Budget,
) -> dict[str, Any]:
    """Two turns on one decoder built as the agent's backend builds it: ``prompt_tokens`` then
    ``new_tokens`` (greedy diffusion, no stop token; cut when the budget runs short), then the
    conversation so far plus a short user turn and a short answer."""
    cuda = model.device.type == "cuda"
    decoder = BlockDecoder(model, tokenizer, PrefixCache(), cuda_graphs=cuda)
    prompt = random_ids(model, prompt_tokens, seed=5)
    params = SamplingParams.for_model(model.config, max_new_tokens=new_tokens, stop_token_ids=())
    out: dict[str, Any] = {"cuda_graphs": decoder.cuda_graphs}
    if not budget.allows("agent path, first turn"):
        return out
    out["first_turn"], answer = _turn(decoder, prompt, params, seconds=max(1.0, budget.left() * 0.5))
    if not budget.allows("agent path, second turn"):
        return out
    follow_up = prompt + answer + random_ids(model, 40, seed=7)
    short = SamplingParams.for_model(model.config, max_new_tokens=min(new_tokens, 256), stop_token_ids=())
    out["second_turn"] = _turn(decoder, follow_up, short, seconds=max(1.0, budget.left() * 0.5))[0]
    if budget.allows("agent path, graphs against eager"):
        out["graphs_vs_eager"] = graphs_against_eager(model, tokenizer, cuda)
    return out


def graphs_against_eager(model: CloverModel, tokenizer: Tokenizer | None, cuda: bool) -> dict[str, Any]:
    """One greedy call (a 512-token prompt, 128 new tokens) on a decoder with CUDA graphs (each
    whole-block pass one replay with its token choice) and on an eager one: whether the tokens are
    the same, and where they first differ. Without CUDA the graphs are rehearsed
    (``BlockDecoder(rehearse_graphs=True)``), so the comparison runs everywhere."""
    prompt = random_ids(model, 512 // model.config.block_size * model.config.block_size, seed=11)
    params = SamplingParams.for_model(model.config, max_new_tokens=128, stop_token_ids=())
    graphs = BlockDecoder(model, tokenizer, cuda_graphs=cuda, rehearse_graphs=not cuda)
    got = graphs.generate(prompt, params).token_ids
    want = BlockDecoder(model, tokenizer).generate(prompt, params).token_ids
    steps = graphs.step_graphs
    assert steps is not None
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    return {
        "tokens": len(want),
        "same": first is None,
        "first_difference": first,
        "replays": steps.replays,
        "pass_replays": sum(n for key, n in steps.replayed.items() if isinstance(key, tuple)),
        "rehearsed": not cuda,
    }
