"""LowConfidence's rules on hand-made confidences: strictly above the threshold, else the single
most confident position with ties to the lowest index; the mask token is never chosen."""

from __future__ import annotations

import torch

from clover_agent.engine.decoding.choice import choose_tokens, low_confidence_fill
from clover_agent.engine.decoding.sampling import SamplingParams


def test_every_position_strictly_above_the_threshold_is_filled() -> None:
    fill, fallback = low_confidence_fill(torch.tensor([0.75, 0.5, 0.25, 0.625]), threshold=0.5)
    assert fill.tolist() == [True, False, False, True] and not fallback  # 0.5 itself is not above


def test_none_above_fills_the_most_confident_one_lowest_index_on_ties() -> None:
    fill, fallback = low_confidence_fill(torch.tensor([0.25, 0.5, 0.5, 0.125]), threshold=0.5)
    assert fill.tolist() == [False, True, False, False] and fallback


def test_the_mask_token_is_never_chosen_and_holds_no_confidence() -> None:
    logits = torch.tensor([[0.0, 1.0, 9.0], [2.0, 0.0, 9.0]])  # the mask (id 2) is the favourite
    tokens, confidence = choose_tokens(logits, SamplingParams(), mask_token_id=2, generator=None)
    assert tokens.tolist() == [1, 0]
    expected = torch.softmax(torch.tensor([[0.0, 1.0], [2.0, 0.0]]), dim=-1).max(dim=-1).values
    # a softmax over three columns, the mask's at -inf, against one over the other two: op order only
    torch.testing.assert_close(confidence, expected, rtol=1e-5, atol=1e-6)
    sampled = SamplingParams(temperature=1.0, seed=0)
    draws, _ = choose_tokens(logits.repeat(50, 1), sampled, 2, torch.Generator().manual_seed(0))
    assert 2 not in draws.tolist()
