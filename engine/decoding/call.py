"""What a decoding mode needs of the call it runs in: :class:`Call`, a protocol that
:class:`~clover_agent.engine.decoding.decoder.DecodeCall` satisfies. The modes (``autoregressive``,
``diffusion``, ``speculative``) and the fused step (``fused_choice``) are typed against it, so they
never import the decoder that dispatches to them: the imports go one way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from clover_agent.engine.decoding.controls import LogitsControls
from clover_agent.engine.decoding.sampling import FinishReason, SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import AttentionRule


class Call(Protocol):
    """One generation call's state and steps, as the modes use them (``decoder.DecodeCall``)."""

    prompt: list[int]
    params: SamplingParams
    controls: LogitsControls
    generated: list[int]
    steps_per_block: list[int]
    fallback_steps: int
    block_size: int
    threshold: float
    mask: int | None
    stops: set[int]
    limit: int
    generator: torch.Generator | None

    def forward(
        self,
        tokens: Sequence[int],
        cache: ModelCache,
        attention: AttentionRule,
        commit: bool | int = False,
        *,
        logit_rows: int | None = None,
        causal_prefix: int = 0,
    ) -> torch.Tensor: ...

    def denoise_pass(
        self,
        prefix: list[int],
        tokens: list[int],
        decided: list[bool],
        cache: ModelCache,
        *,
        commit: int = 0,
        causal_prefix: int = 0,
    ) -> bool: ...

    def start_cache(self, attention: AttentionRule, max_length: int, multiple_of: int) -> ModelCache: ...

    def prefill(self, cache: ModelCache, end: int, attention: AttentionRule) -> None: ...

    def choose(
        self, logits: torch.Tensor, positions: Sequence[int], decided: Sequence[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def denoise(
        self, logits: torch.Tensor, tokens: list[int], decided: list[bool], *, fill_all: bool = False
    ) -> bool: ...

    def emit(self, block: int, tokens: list[int]) -> BlockCommitted: ...

    def first_stop(self, tokens: Sequence[int]) -> int | None: ...

    def finish(self, reason: FinishReason, cache: ModelCache, attention: AttentionRule) -> GenerationDone: ...

    def causal_done(self, cache: ModelCache) -> GenerationDone | None: ...
