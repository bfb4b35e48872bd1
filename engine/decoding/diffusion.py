"""Block diffusion with LowConfidence (``mode="diffusion"``), the default decoding mode.

Blocks are aligned to absolute positions (multiples of ``block_size`` from 0). Whole prompt blocks
are prefilled with committing forwards; the prompt's partial last block shares the first
generation block, its prompt positions fixed. Each block starts with every generated position
masked. A denoising pass (``attention="block"``, no commit) gives logits for the block's open
rows; the controls adjust them; LowConfidence fills every masked position whose confidence is
strictly above the threshold, or, when none is, the single most confident one (ties: lowest
index). The mask token is never emitted. When the block is full, a commit writes its K/V, GDN
state and conv tail. The call ends

* at the first stop token, excluded from the output, as soon as it and every position before it are
  decided (no commit: nothing follows);
* at ``max_new_tokens`` (or the context window): the last block is decoded whole, every position
  masked as in training, and the output trimmed; it ends as soon as every position within the
  limit is decided, since decided tokens never change;
* after a repeated block when ``loop_action="stop"``.

Options (``SamplingParams``):

* ``fuse_commit``: a finished block is not committed by a pass of its own; the next block's first
  denoising pass runs over both blocks (2 x block_size tokens), committing the first one and
  giving logits for the second only. The state after it, and so every token, is the same.
* ``causal_context``: the committed context is encoded causally (prefill and commits under
  ``attention="causal"``, a fused commit with ``causal_prefix``); denoising passes still see their
  own block whole on top of it. Its snapshots are causal state, shared with the causal modes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from clover_agent.engine.decoding.sampling import FinishReason
from clover_agent.engine.decoding.stream import BlockProgress, StreamEvent

if TYPE_CHECKING:
    from clover_agent.engine.decoding.decoder import DecodeCall


def diffusion(call: DecodeCall) -> Iterator[StreamEvent]:
    params, size = call.params, call.block_size
    context = "causal" if params.causal_context else "block"  # how committed tokens are encoded
    aligned = len(call.prompt) // size * size
    cache = call.start_cache(context, aligned, size)
    call.prefill(cache, aligned, context)
    unfused: list[int] = []  # a finished block whose commit rides on the next block's first pass
    block = 0
    while True:
        fixed = call.prompt[cache.length :] if block == 0 else []
        slots = size - len(fixed)
        remaining = call.limit - len(call.generated)
        tokens = [call.mask] * slots
        decided = [False] * slots
        steps = 0
        finish: tuple[FinishReason, int] | None = None
        while not all(decided):
            if unfused:
                logits = call.forward(
                    unfused + tokens,
                    cache,
                    "block",
                    commit=len(unfused),
                    causal_prefix=len(unfused) if params.causal_context else 0,
                    logit_rows=slots,
                )
                unfused = []
            else:
                logits = call.forward(fixed + tokens, cache, "block", logit_rows=slots)
            steps += 1
            call.fallback_steps += call.denoise(logits, tokens, decided)
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
    call: DecodeCall, tokens: list[int], decided: list[bool], remaining: int
) -> tuple[FinishReason, int] | None:
    """(reason, tokens to keep) once the decided prefix of the block settles the call."""
    for i in range(min(remaining, len(tokens))):
        if not decided[i]:
            return None
        if tokens[i] in call.stops:
            return "stop", i
    return ("length", remaining) if remaining <= len(tokens) else None
