"""Plain-PyTorch reference of token choice and the LowConfidence fill, as ``engine/decoding/choice.py``
(``choose_tokens``, ``low_confidence_fill``) and ``engine/decoding/controls.py`` define them, in a
form the fused kernels share: the per-row numbers of the controls arrive as tensors
(:class:`LogitsAdjustment`), the fill needs no host read-back. The order of the steps on a row is
in :func:`adjust_logits` and :func:`choose_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

ConfidenceRule = Literal["probability", "sglang"]
#: The commit confidence rules: the names of the engine's ``SamplingParams.confidence``, the same numbers.
CONFIDENCE_RULES: tuple[str, ...] = ("probability", "sglang")


@dataclass(frozen=True)
class TokenChoice:
    """How a row's token is chosen (per call; plain numbers, fixed while a CUDA graph replays)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0 (or >= V): no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    mask_token_id: int | None = None
    confidence_rule: ConfidenceRule = "probability"

    def __post_init__(self) -> None:
        if self.confidence_rule not in CONFIDENCE_RULES:
            raise ValueError(f"confidence_rule must be one of {', '.join(CONFIDENCE_RULES)}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class LogitsAdjustment:
    """The controls' effect on a step's rows. Tensors live on the logits' device and are read-only.

    counts: [V] float, how often each token was generated (committed tokens; the block's decided
    tokens are added by the step); bias_token_ids [NB] int64 with row_bias [T, NB] float32: add
    ``row_bias[r, j]`` to column ``bias_token_ids[j]`` of row r (-inf forbids); forced_token [T]
    int64: the row's only allowed token (-1: none).
    """

    counts: torch.Tensor | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    bias_token_ids: torch.Tensor | None = None
    row_bias: torch.Tensor | None = None
    forced_token: torch.Tensor | None = None

    @property
    def penalizing(self) -> bool:
        return self.counts is not None and (
            self.repetition_penalty != 1.0 or self.presence_penalty > 0.0 or self.frequency_penalty > 0.0
        )


@dataclass(frozen=True)
class StepResult:
    """What one LowConfidence step chose: ``chosen`` / ``confidence`` [T] for the rows that were open
    (decided rows: their token, confidence -inf), ``fill`` [T] bool the rows filled now, ``done`` and
    ``fallback`` one-element bool tensors (every row decided now; no row passed the threshold)."""

    chosen: torch.Tensor
    confidence: torch.Tensor
    fill: torch.Tensor
    done: torch.Tensor
    fallback: torch.Tensor


def step_counts(adjustment: LogitsAdjustment, tokens: torch.Tensor, decided: torch.Tensor) -> torch.Tensor:
    """The penalties' counts for a block step: committed counts plus the block's decided tokens."""
    counts = adjustment.counts
    assert counts is not None, "step_counts needs a penalizing adjustment"
    return counts.index_add(0, tokens.long(), decided.to(counts.dtype))


def adjust_logits(
    logits: torch.Tensor, adjustment: LogitsAdjustment | None, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """Controlled float32 copy of ``logits`` [T, V] (``LogitsControls.apply`` given its per-row numbers);
    ``counts`` overrides ``adjustment.counts``.

    Order on a row: repetition / presence / frequency penalties over the counts of generated tokens
    (committed plus those already decided in the block), per-row biases on a few token columns (the
    thinking and end-of-response ramps), forced rows (the thinking hard close: every logit -inf but
    the forced token's 0)."""
    out = logits.float().clone()
    if adjustment is None:
        return out
    if adjustment.penalizing:
        counts = adjustment.counts if counts is None else counts
        assert counts is not None  # penalizing: adjustment.counts is set
        seen = counts > 0
        penalty = adjustment.repetition_penalty
        if penalty != 1.0:
            out = torch.where(seen, torch.where(out > 0, out / penalty, out * penalty), out)
        if adjustment.presence_penalty:
            out -= adjustment.presence_penalty * seen.float()
        if adjustment.frequency_penalty:
            out -= adjustment.frequency_penalty * counts.float()
    if adjustment.bias_token_ids is not None:
        row_bias = adjustment.row_bias
        assert row_bias is not None, "bias_token_ids come with their row_bias"
        for j, token in enumerate(adjustment.bias_token_ids.tolist()):
            out[:, token] += row_bias[:, j].float()
    if adjustment.forced_token is not None:
        forced = adjustment.forced_token
        rows = forced >= 0
        out = torch.where(rows[:, None], float("-inf"), out)
        out[rows, forced[rows]] = 0.0
    return out


def choose_tokens(
    logits: torch.Tensor, choice: TokenChoice, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and commit confidence [T] for each row of controlled ``logits`` [T, V] (``choose_tokens``
    of the engine, plus the confidence rule). The mask token's logit is -inf first.

    Then greedy (argmax) or sampling (temperature, top-k, top-p, a draw from the filtered,
    renormalised distribution); the confidence is :func:`commit_confidence`'s."""
    logits = logits.float().clone()
    if choice.mask_token_id is not None:
        logits[:, choice.mask_token_id] = float("-inf")
    if choice.greedy:
        confidence, tokens = torch.softmax(logits, dim=-1).max(dim=-1)  # as commit_confidence
        return tokens, confidence
    probs = torch.softmax(filtered(logits / choice.temperature, choice.top_k, choice.top_p), dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, commit_confidence(logits, tokens, choice)


def commit_confidence(logits: torch.Tensor, tokens: torch.Tensor, choice: TokenChoice) -> torch.Tensor:
    """Commit confidence [T] of ``tokens`` [T] chosen from controlled float32 ``logits`` [T, V] (the
    mask token's logit already -inf); the engine's ``commit_confidence`` under the same names.

    Greedy rows: the top-1 probability (both rules). Sampled rows, by ``choice.confidence_rule``:

    - ``"probability"``: the token's probability under the temperature-scaled, top-k / top-p
      filtered, renormalised distribution;
    - ``"sglang"``: SGLang's dLLM rule ``min(p_argmax, exp((z - z_max) / T))``, with p_argmax the top-1
      probability of the logits at temperature 1 and unfiltered (what SGLang's greedy path commits on),
      z the token's logit and z_max the largest.

    docs/decoding.md cites SGLang's source.
    """
    argmax_probability = torch.softmax(logits, dim=-1).max(dim=-1).values
    if choice.greedy:
        return argmax_probability
    if choice.confidence_rule == "sglang":
        token_logit = logits.gather(1, tokens[:, None]).squeeze(1)
        ratio = torch.exp((token_logit - logits.max(dim=-1).values) / choice.temperature)
        return torch.minimum(argmax_probability, ratio)
    probs = torch.softmax(filtered(logits / choice.temperature, choice.top_k, choice.top_p), dim=-1)
    return probs.gather(1, tokens[:, None]).squeeze(1)


def filtered(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus: the smallest set of most likely tokens whose mass reaches top_p)."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def low_confidence_fill(
    confidence: torch.Tensor, open_rows: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows to fill among ``open_rows`` [T] bool, and whether this was the fallback, without a host
    read-back: every open row strictly above ``threshold``; if none, the single most confident open
    row (ties: the lowest index)."""
    above = open_rows & (confidence > threshold)
    fallback = ~above.any() & open_rows.any()
    best = torch.where(open_rows, confidence, float("-inf")).argmax()
    single = torch.arange(confidence.shape[0], device=confidence.device) == best
    fill = torch.where(above.any(), above, single & open_rows)
    return fill, fallback.reshape(1)


def low_confidence_step(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    decided: torch.Tensor,
    choice: TokenChoice,
    threshold: float,
    adjustment: LogitsAdjustment | None = None,
    generator: torch.Generator | None = None,
) -> StepResult:
    """One denoising step of a block: choose a token for every open row of ``logits`` [T, V] (rows not
    ``decided``), fill by LowConfidence, and update ``tokens`` [T] int64 and ``decided`` [T] bool in
    place. The penalties count the block's decided tokens too. Reads the open rows back to the host
    (the CPU path; draws consume the generator exactly as the engine's loop does)."""
    counts = (
        step_counts(adjustment, tokens, decided) if adjustment is not None and adjustment.penalizing else None
    )
    open_rows = ~decided
    rows = open_rows.nonzero().squeeze(1)  # as the engine draws: the open rows only, in order
    picked, picked_confidence = choose_tokens(
        adjust_logits(logits, adjustment, counts)[rows], choice, generator
    )
    chosen = tokens.clone()
    chosen[rows] = picked
    confidence = torch.full(tokens.shape, float("-inf"), device=logits.device)
    confidence[rows] = picked_confidence
    fill, fallback = low_confidence_fill(confidence, open_rows, threshold)
    tokens.copy_(torch.where(fill, chosen, tokens))
    decided |= fill
    return StepResult(chosen, confidence, fill, decided.all().reshape(1), fallback)
