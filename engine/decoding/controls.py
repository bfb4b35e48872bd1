"""Logits controls: what :class:`SamplingParams` asks beyond the bare decoding contract.

Repetition, presence and frequency penalties, the thinking budget and its ramp, the end-of-response
bias and loop detection act on the logits of every still-undecided position before its confidence
is computed, each only in its phase, so with default parameters :meth:`LogitsControls.apply`
returns the logits untouched and decoding is the bare contract. What each does, and what counts
as a generated token, is in docs/decoding.md ("Controls").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.ops.transfer import upload

if TYPE_CHECKING:
    from clover_agent.kernels.low_confidence import LogitsAdjustment


#: Most the loop penalty multiplies the repetition penalty by (1.3 ** 35 is about 9,800): past it a
#: repeated token is as good as banned already, and the factor would grow to inf (NaN logits).
MAX_LOOP_FACTOR = 1e4


def loop_factor(loop_penalty: float, repeats: int) -> float:
    """``loop_penalty ** repeats``, at most :data:`MAX_LOOP_FACTOR` (never computed past it, so
    no repeat count overflows)."""
    if repeats <= 0 or loop_penalty <= 1.0:
        return 1.0
    if repeats * math.log(loop_penalty) >= math.log(MAX_LOOP_FACTOR):
        return MAX_LOOP_FACTOR
    return loop_penalty**repeats


@dataclass(frozen=True)
class ControlTokens:
    """Token ids the controls steer towards; None when the vocabulary has no such token."""

    think_end: int | None
    response_end: int | None


class LogitsControls:
    """Per-call state of the controls: counts of generated tokens, where ``</think>`` went, repeats."""

    def __init__(self, params: SamplingParams, tokens: ControlTokens, vocab_size: int, device: torch.device):
        if params.thinking_budget is not None and tokens.think_end is None:
            raise ValueError(
                "thinking_budget needs the </think> token id: the checkpoint has no tokenizer with "
                "</think>; pass SamplingParams.think_end_token_id"
            )
        self.params = params
        self.tokens = tokens
        self.counts = torch.zeros(vocab_size, device=device)
        self.generated = 0
        self.think_end_at: int | None = None
        self.repeats = 0
        self._blocks: set[tuple[int, ...]] = set()

    @property
    def repetition_penalty(self) -> float:
        p = self.params
        factor = loop_factor(p.loop_penalty, self.repeats) if p.loop_action == "penalize" else 1.0
        return p.repetition_penalty * factor

    @property
    def penalizing(self) -> bool:
        p = self.params
        return self.repetition_penalty != 1.0 or p.presence_penalty > 0.0 or p.frequency_penalty > 0.0

    @property
    def active(self) -> bool:
        """False when apply() would change nothing (the bare contract)."""
        p = self.params
        thinking = p.thinking and self.tokens.think_end is not None
        ending = p.end_bias_start is not None and self.tokens.response_end is not None
        return self.penalizing or thinking or ending

    # ---- state updates -----------------------------------------------------------------------
    def observe(self, token_ids: Sequence[int]) -> None:
        """Record tokens appended to the output (committed, in order)."""
        if not token_ids:
            return
        ids = upload(list(token_ids), self.counts.device)
        self.counts.index_add_(0, ids, torch.ones_like(ids, dtype=self.counts.dtype))
        if self.think_end_at is None and self.tokens.think_end in token_ids:
            self.think_end_at = self.generated + list(token_ids).index(self.tokens.think_end)  # type: ignore[arg-type]
        self.generated += len(token_ids)

    def observe_block(self, token_ids: Sequence[int]) -> bool:
        """Record a finished block's generated tokens; True when it repeats an earlier block."""
        key = tuple(token_ids)
        repeated = key in self._blocks
        self._blocks.add(key)
        if repeated:
            self.repeats += 1
        return repeated

    # ---- the controls ------------------------------------------------------------------------
    def apply(
        self, logits: torch.Tensor, positions: Sequence[int], decided: Sequence[tuple[int, int]] = ()
    ) -> torch.Tensor:
        """Controlled copy of ``logits`` [n, V]: row i is for generated position ``positions[i]``;
        ``decided`` lists (generated position, token) pairs decided but not yet observed."""
        if not self.active:
            return logits
        out = logits.clone()
        if self.penalizing:
            counts = self.counts
            if decided:
                counts = counts.clone()
                ids = upload([t for _, t in decided], counts.device)
                counts.index_add_(0, ids, torch.ones_like(ids, dtype=counts.dtype))
            self._penalize(out, counts)
        self._steer(out, positions, self._think_end_at(decided))
        return out

    def _penalize(self, logits: torch.Tensor, counts: torch.Tensor) -> None:
        seen = counts > 0
        penalty = self.repetition_penalty
        if penalty != 1.0:
            penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits.copy_(torch.where(seen, penalized, logits))
        p = self.params
        if p.presence_penalty:
            logits -= p.presence_penalty * seen.to(logits.dtype)
        if p.frequency_penalty:
            logits -= p.frequency_penalty * counts.to(logits.dtype)

    def _think_end_at(self, decided: Sequence[tuple[int, int]]) -> int | None:
        at = [pos for pos, tok in decided if tok == self.tokens.think_end]
        if self.think_end_at is not None:
            at.append(self.think_end_at)
        return min(at) if at else None

    def _steer(self, logits: torch.Tensor, positions: Sequence[int], think_end_at: int | None) -> None:
        """Thinking and end-of-response biases; per-row numbers in Python, then one update per column."""
        think_end, response_end = self.tokens.think_end, self.tokens.response_end
        think_bias, end_bias, forced = self._steering(positions, think_end_at)
        if any(think_bias):
            logits[:, think_end] += upload(think_bias, logits.device, logits.dtype)
        if any(end_bias):
            logits[:, response_end] += upload(end_bias, logits.device, logits.dtype)
        if forced:
            rows = upload(forced, logits.device)
            logits[rows] = float("-inf")
            logits[rows, think_end] = 0.0

    def adjustment(
        self, positions: Sequence[int], tokens: Sequence[int], decided: Sequence[bool]
    ) -> LogitsAdjustment | None:
        """The controls of a block step's rows (row i: generated position ``positions[i]``, its token
        ``tokens[i]`` when ``decided[i]``) as the fused token-choice kernel takes them, or None when
        they change nothing. The kernel adds the block's decided tokens to the counts itself."""
        if not self.active:
            return None
        from clover_agent.kernels.low_confidence import LogitsAdjustment

        device = self.counts.device
        biases, forced_token = self.pass_numbers(positions, tokens, decided)
        columns = [(token, bias) for token, bias in biases if any(bias)]
        p = self.params
        return LogitsAdjustment(
            counts=self.counts if self.penalizing else None,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            bias_token_ids=upload([token for token, _ in columns], device) if columns else None,
            row_bias=(
                upload([v for _, bias in columns for v in bias], device, torch.float32)
                .reshape(len(columns), len(positions))
                .t()
                .contiguous()
                if columns
                else None
            ),
            forced_token=upload(forced_token, device) if any(t >= 0 for t in forced_token) else None,
        )

    def layout(self) -> tuple[tuple[int, ...], bool]:
        """The token columns this call's controls may ever bias, and whether they may force a row:
        the fixed layout of the numbers :meth:`pass_numbers` gives (a captured pass's buffers)."""
        p = self.params
        forcing = p.thinking and self.tokens.think_end is not None and p.thinking_budget is not None
        return tuple(token for token, _ in self._columns()), forcing

    def _columns(self) -> list[tuple[int, str]]:
        p, think_end, response_end = self.params, self.tokens.think_end, self.tokens.response_end
        columns = [(think_end, "think")] if p.thinking and think_end is not None else []
        if p.end_bias_start is not None and response_end is not None:
            columns.append((response_end, "end"))
        return columns

    def pass_numbers(
        self, positions: Sequence[int], tokens: Sequence[int], decided: Sequence[bool]
    ) -> tuple[list[tuple[int, list[float]]], list[int]]:
        """A block step's steering numbers in :meth:`layout`'s order: (column token, its bias per
        row) for each column (zeros where nothing applies now), and the token each row is forced
        to (-1: none)."""
        pairs = [(pos, tok) for pos, tok, done in zip(positions, tokens, decided, strict=True) if done]
        think_bias, end_bias, forced = self._steering(positions, self._think_end_at(pairs))
        steering = {"think": think_bias, "end": end_bias}
        forced_token = [-1] * len(positions)
        for row in forced:
            forced_token[row] = self.tokens.think_end  # type: ignore[assignment]  # forced: thinking has </think>
        return [(token, steering[kind]) for token, kind in self._columns()], forced_token

    def _steering(
        self, positions: Sequence[int], think_end_at: int | None
    ) -> tuple[list[float], list[float], list[int]]:
        """Per row: the bias on ``</think>`` (all zero unless thinking), the bias on the response
        end, and the rows forced to ``</think>`` (the thinking budget's hard close)."""
        p = self.params
        think_end, response_end = self.tokens.think_end, self.tokens.response_end
        thinking = p.thinking and think_end is not None
        think_bias, end_bias, forced = [], [], []
        for row, position in enumerate(positions):
            bias = 0.0
            if thinking and think_end_at is not None:
                bias = float("-inf")  # at most one </think>
            elif thinking and p.thinking_budget is not None:
                budget = p.thinking_budget
                if position == budget:
                    forced.append(row)  # the hard close
                elif position > budget:
                    bias = float("-inf")
                else:
                    bias = _ramp(
                        position, _ramp_start(p.thinking_ramp_start, budget), budget, p.thinking_ramp_strength
                    )
            think_bias.append(bias)
            if not p.thinking:
                answering = True
            elif think_end_at is not None:
                answering = position > think_end_at
            else:
                answering = p.thinking_budget is not None and position > p.thinking_budget
            if answering and p.end_bias_start is not None and response_end is not None:
                start = _ramp_start(p.end_bias_start, p.max_new_tokens)
                end_bias.append(_ramp(position, start, p.max_new_tokens, p.end_bias_strength))
            else:
                end_bias.append(0.0)
        return think_bias, end_bias, forced


def _ramp_start(fraction: float, total: int) -> int:
    """The first position at or after ``fraction * total`` (rounded first: 0.57 * 100 is 56.99...
    in floating point, and the ramp must not start a position early)."""
    return math.ceil(round(fraction * total, 6))


def _ramp(position: int, start: int, end: int, strength: float) -> float:
    """Linear bias: 0 before ``start``, reaching ``strength`` at ``end - 1``."""
    if position < start or end <= start:
        return 0.0
    return strength * min(1.0, (position - start + 1) / (end - start))
