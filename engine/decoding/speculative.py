"""Self-speculative decoding (``mode="self_speculative"``): diffusion drafts, one causal verify.

The committed context is causal, so the output equals greedy autoregressive decoding (and, when
sampling, is distributed as autoregressive sampling); rounds, pending tokens and what a verify
pass commits are in docs/decoding.md ("Modes").
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import torch

from clover_agent.engine.decoding.choice import choose_tokens
from clover_agent.engine.decoding.stream import BlockProgress, StreamEvent
from clover_agent.engine.model.cache import ModelCache

if TYPE_CHECKING:
    from clover_agent.engine.decoding.call import Call


def self_speculative(call: Call) -> Iterator[StreamEvent]:
    """The rounds of one call. The cache always ends on a block boundary; the accepted tokens after
    it are *pending* (re-fed to every verify pass). A round drafts the positions up to the end of
    the current block (the whole next block when the pending tokens fill theirs), then one causal
    pass over pending + draft verifies it and commits only whole blocks of tokens accepted in
    earlier rounds, so state advances over accepted tokens only and never twice."""
    size = call.block_size
    # At least one prompt token stays pending: its causal logits give the first new token.
    aligned = (len(call.prompt) - 1) // size * size
    cache = call.start_cache("causal", aligned, size)
    call.prefill(cache, aligned, "causal")
    pending = call.prompt[cache.length :]  # always ends at the last known token
    block = 0
    while True:
        committable = len(pending) // size * size
        draft, draft_passes = yield from _draft(call, block, cache, pending, size - len(pending) % size)
        logits = call.forward(
            pending + draft, cache, "causal", commit=committable or False, logit_rows=len(draft) + 1
        )
        accepted = _verify(call, logits, draft)
        pending = pending[committable:] + accepted
        call.steps_per_block.append(draft_passes + 1)
        room = call.limit - len(call.generated)
        stop = call.first_stop(accepted)
        if stop is not None and stop < room:
            yield call.emit(block, accepted[:stop])
            yield call.finish("stop", cache, "causal")
            return
        yield call.emit(block, accepted[:room])
        if (done := call.causal_done(cache)) is not None:
            yield done
            return
        block += 1


def _draft(
    call: Call, block: int, cache: ModelCache, pending: list[int], length: int
) -> Generator[StreamEvent, None, tuple[list[int], int]]:
    """Draft ``length`` tokens after ``pending`` by diffusion on top of the causal cache: LowConfidence
    for ``draft_steps - 1`` passes, then every remaining mask from the last pass. Returns the draft and
    the number of passes it took."""
    mask = call.mask
    assert mask is not None  # DecodeCall refuses a checkpoint without a mask token for this mode
    tokens = [mask] * length
    decided = [False] * length
    passes = call.params.draft_steps
    for step in range(passes):
        logits = call.forward(pending + tokens, cache, "block", logit_rows=length)
        call.denoise(logits, tokens, decided, fill_all=step == passes - 1)
        yield BlockProgress(block, cache.length + len(pending), step + 1, list(tokens), list(decided))
        if all(decided):
            break
    return tokens, step + 1


def _verify(call: Call, rows: torch.Tensor, draft: list[int]) -> list[int]:
    """The accepted draft prefix plus the causal choice after it; ``rows[j]`` predicts ``draft[j]``.

    Every row is chosen at once (the controls of row j see the draft tokens before it as generated),
    then read back once."""
    base = len(call.generated)
    if call.controls.active:
        controlled = torch.cat(
            [
                call.controls.apply(rows[j : j + 1], [base + j], [(base + i, draft[i]) for i in range(j)])
                for j in range(len(draft) + 1)
            ]
        )
    else:
        controlled = rows
    targets = choose_tokens(controlled, call.params, call.mask, call.generator)[0].tolist()
    accepted: list[int] = []
    for j, target in enumerate(targets):
        accepted.append(target)
        if j == len(draft) or draft[j] != target:
            break
    return accepted
