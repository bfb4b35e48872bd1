"""Block diffusion with LowConfidence (``mode="diffusion"``), the default decoding mode.

The block loop (prefill, denoising passes, LowConfidence, commits, the stop and length rules) and
its options ``fuse_commit`` and ``causal_context`` are in docs/decoding.md ("The block loop").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from clover_agent.engine.decoding.sampling import FinishReason
from clover_agent.engine.decoding.stream import BlockProgress, StreamEvent

if TYPE_CHECKING:
    from clover_agent.engine.decoding.call import Call
    from clover_agent.engine.model.network import AttentionRule


def diffusion(call: Call) -> Iterator[StreamEvent]:
    params, size = call.params, call.block_size
    # how committed tokens are encoded
    context: AttentionRule = "causal" if params.causal_context else "block"
    mask = call.mask
    assert mask is not None  # DecodeCall refuses a checkpoint without a mask token for this mode
    aligned = len(call.prompt) // size * size
    cache = call.start_cache(context, aligned, size)
    call.prefill(cache, aligned, context)
    unfused: list[int] = []  # a finished block whose commit rides on the next block's first pass
    block = 0
    while True:
        fixed = call.prompt[cache.length :] if block == 0 else []
        slots = size - len(fixed)
        remaining = call.limit - len(call.generated)
        tokens = [mask] * slots
        decided = [False] * slots
        steps = 0
        finish: tuple[FinishReason, int] | None = None
        while not all(decided):
            if unfused:
                fallback = call.denoise_pass(
                    unfused,
                    tokens,
                    decided,
                    cache,
                    commit=len(unfused),
                    causal_prefix=len(unfused) if params.causal_context else 0,
                )
                unfused = []
            else:
                fallback = call.denoise_pass(fixed, tokens, decided, cache)
            steps += 1
            call.fallback_steps += fallback
            yield BlockProgress(block, cache.length + len(fixed), steps, list(tokens), list(decided))
            finish = _settled(call, tokens, decided, remaining)
            if finish is not None:
                break
        call.steps_per_block.append(steps)
        if finish is not None:
            reason, keep = finish
            yield call.emit(block, tokens[:keep])
            yield call.finish(reason, cache, context)
            return
        if params.fuse_commit:
            unfused = fixed + tokens
        else:
            call.forward(fixed + tokens, cache, context, commit=True, logit_rows=0)
        yield call.emit(block, tokens)
        if call.controls.observe_block(tokens) and params.loop_action == "stop":
            yield call.finish("loop", cache, context)
            return
        block += 1


def _settled(
    call: Call, tokens: list[int], decided: list[bool], remaining: int
) -> tuple[FinishReason, int] | None:
    """(reason, tokens to keep) once the decided prefix of the block settles the call."""
    for i in range(min(remaining, len(tokens))):
        if not decided[i]:
            return None
        if tokens[i] in call.stops:
            return "stop", i
    return ("length", remaining) if remaining <= len(tokens) else None
