"""What ``Engine.stream`` yields while it decodes: typed events a live view or a backend consumes.

Names are the engine's own (``BlockProgress``, ``BlockCommitted``, ``GenerationDone``), distinct from
the agent's events (:mod:`clover_agent.events`), which a backend builds from these.
"""

from __future__ import annotations

from dataclasses import dataclass

from clover_agent.engine.decoding.sampling import GenerationResult


@dataclass(frozen=True)
class BlockProgress:
    """State of the block being decoded after a pass (for a live view; nothing here is final).

    ``block``: the block's index in this call; ``position``: absolute position of its first
    generated slot; ``step``: passes over this block so far (1 after the first); ``token_ids``
    [slots]: decided tokens, ``mask_token_id`` where ``filled`` is False. In ``self_speculative``
    mode it is the draft (``filled`` all True at the end) before verification."""

    block: int
    position: int
    step: int
    token_ids: list[int]
    filled: list[bool]


@dataclass(frozen=True)
class BlockCommitted:
    """Tokens that became final output (stop token excluded, trimmed to the limit): one diffusion
    block, one speculative round's accepted tokens, or one autoregressive token. ``text`` is the
    text they add to the output (None without a tokenizer)."""

    block: int
    token_ids: list[int]
    text: str | None


@dataclass(frozen=True)
class GenerationDone:
    """The call's result and statistics (``result.stats()``); always the last event."""

    result: GenerationResult


StreamEvent = BlockProgress | BlockCommitted | GenerationDone
