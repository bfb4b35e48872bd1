"""Token choice: a token and a commit confidence per row of controlled logits, and LowConfidence.

Greedy, sampling (top-k then top-p, as ``transformers``' warpers) and the commit confidence rules
(``SamplingParams.confidence``) are in docs/decoding.md ("Token choice and the commit confidence").
All of it stays on the device (no host read): the decoder reads the result back once per pass. The
mask token's logit is -inf before any of this, so it is never chosen.
"""

from __future__ import annotations

import torch

from clover_agent.engine.decoding.sampling import SamplingParams


def choose_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    mask_token_id: int | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and commit confidence [n] for each row of controlled ``logits`` [n, V] (not modified)."""
    logits = logits.float()
    if mask_token_id is not None:
        index = torch.full((1,), mask_token_id, device=logits.device)  # a fill: no host copy
        logits = logits.index_fill(1, index, float("-inf"))
    if params.greedy_draws:
        tokens = logits.argmax(dim=-1)
        return tokens, _probability_of(logits, tokens)  # as commit_confidence
    probs = sampling_distribution(logits, params)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, commit_confidence(logits, tokens, params, probs)


def commit_confidence(
    logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """Commit confidence [n] of ``tokens`` [n] chosen from controlled float32 ``logits`` [n, V] (the
    mask token's logit already -inf), by ``params.confidence``; ``probs``: the rows'
    :func:`sampling_distribution` when the caller has it.

    Greedy: the top-1 probability. Sampling, ``"probability"``: the token's probability under the
    filtered, renormalised distribution it was drawn from; ``"sglang"``: SGLang's dLLM rule,
    ``min(p_argmax, exp((z_token - z_max) / T))`` with p_argmax the top-1 probability of the
    logits at temperature 1, unfiltered, and z the logits (docs/decoding.md cites the source)."""
    top, argmax = logits.max(dim=-1)
    argmax_probability = _probability_of(logits, argmax)
    if params.greedy_draws:
        return argmax_probability
    if params.confidence == "sglang":
        token_logit = logits.gather(1, tokens[:, None]).squeeze(1)
        relative = torch.exp((token_logit - top) / params.temperature)
        return torch.minimum(argmax_probability, relative)
    probs = sampling_distribution(logits, params) if probs is None else probs
    return probs.gather(1, tokens[:, None]).squeeze(1)


def _probability_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(logits)[row, token] per row: one softmax kernel (on the CPU an order of magnitude
    faster than ``exp(z - logsumexp(z))`` over a 248,320-token row)."""
    return torch.softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)


def sampling_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [n, V] after temperature, top-k (keep the k largest), then top-p (keep the
    smallest set of most likely tokens whose mass reaches ``top_p``), renormalised."""
    scaled = logits.float() / params.temperature
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        values, index = torch.topk(scaled, params.top_k, dim=-1)  # sorted, most likely first
        kept = _nucleus(torch.softmax(values, dim=-1), params.top_p)
        return torch.zeros_like(scaled).scatter_(1, index, kept)
    if params.top_p < 1.0:
        values, index = torch.sort(scaled, dim=-1, descending=True)
        kept = _nucleus(torch.softmax(values, dim=-1), params.top_p)
        return torch.zeros_like(scaled).scatter_(1, index, kept)
    return torch.softmax(scaled, dim=-1)


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over probabilities sorted most likely first: a token stays while the mass before it is
    below ``top_p`` (the most likely one always stays); renormalised."""
    if top_p >= 1.0:
        return sorted_probs
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    kept = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def low_confidence_fill(confidence: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of the candidate positions (confidence [n]) to fill, and whether this was a fallback
    (a 0-d bool tensor); both stay on the device.

    Every position strictly above ``threshold``; if none, the single most confident one, the lowest
    index among ties (``argmax`` returns the first maximum)."""
    above = confidence > threshold
    fallback = ~above.any()
    best = torch.zeros_like(above).index_fill_(0, torch.argmax(confidence).view(1), True)
    return torch.where(fallback, best, above), fallback
