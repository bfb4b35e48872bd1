"""Autoregressive decoding (``mode="autoregressive"``): one causal forward per token, each
committing its input token; the baseline, and the only mode for a checkpoint without a mask token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from clover_agent.engine.decoding.stream import StreamEvent

if TYPE_CHECKING:
    from clover_agent.engine.decoding.call import Call


def autoregressive(call: Call) -> Iterator[StreamEvent]:
    size = call.block_size
    cache = call.start_cache("causal", len(call.prompt) - 1, 1)
    call.prefill(cache, (len(call.prompt) - 1) // size * size, "causal")
    logits = call.forward(call.prompt[cache.length :], cache, "causal", commit=True, logit_rows=1)
    while True:
        token = call.choose(logits, [len(call.generated)], [])[0].tolist()[0]
        call.steps_per_block.append(1)
        if token in call.stops:
            yield call.finish("stop", cache, "causal")
            return
        yield call.emit(len(call.generated) // size, [token])
        if (done := call.causal_done(cache)) is not None:
            yield done
            return
        logits = call.forward([token], cache, "causal", commit=True)
