"""The fused token choice and LowConfidence kernels against the PyTorch reference (the engine's
semantics): greedy exactly, sampling by distribution and by the exact kept set and probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from clover_agent.kernels import low_confidence as lc
from clover_agent.kernels.low_confidence import choose, reference
from clover_agent.kernels.low_confidence.reference import LogitsAdjustment, TokenChoice
from tests.kernels.helpers import DEVICE, requires_triton

pytestmark = requires_triton


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of 64 columns, so small rows still stream over several tiles."""
    monkeypatch.setattr(choose, "BLOCK_V", 64)


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def adjustment(rows: int, vocab: int, seed: int) -> LogitsAdjustment:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(vocab)
    counts[torch.randint(0, vocab, (vocab // 4,), generator=gen)] += 1.0
    counts[3] = 3.0
    return LogitsAdjustment(
        counts=counts.to(DEVICE),
        repetition_penalty=1.4,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        bias_token_ids=torch.tensor([7, vocab - 2, 7], device=DEVICE),  # the same column twice adds twice
        row_bias=torch.cat([torch.randn(rows, 2, generator=gen) * 4, torch.full((rows, 1), 1.5)], 1).to(
            DEVICE
        ),
        forced_token=torch.tensor([-1] * (rows - 1) + [vocab - 5], device=DEVICE),
    )


@pytest.mark.parametrize(("rows", "vocab"), [(5, 5000), (1, 77), (33, 130)])
def test_greedy_matches_reference(rows: int, vocab: int, poisoned_allocations: None) -> None:
    logits = random_logits(rows, vocab, seed=vocab)
    logits[0, 4] = 50.0  # the mask token is the row's maximum: never chosen
    choice = TokenChoice(mask_token_id=4)
    chosen, confidence = lc.choose_tokens(logits, choice)
    want_chosen, want_confidence = reference.choose_tokens(logits, choice)
    assert torch.equal(chosen, want_chosen) and chosen[0] != 4  # exact: token ids, argmax of the same logits
    # a float32 softmax's maximum (a probability <= 1) over <= 5000 logits, tiled: op order of the sum
    torch.testing.assert_close(confidence, want_confidence, rtol=1e-5, atol=1e-6)


def test_greedy_ties_take_the_lowest_index(small_tiles: None, poisoned_allocations: None) -> None:
    logits = random_logits(3, 200, seed=1)
    logits[0, [150, 10]] = 9.0  # tie across tiles
    logits[1, [71, 70]] = 9.0  # tie inside a tile
    logits[2, [199, 130]] = 9.0
    chosen, _ = lc.choose_tokens(logits, TokenChoice())
    assert chosen.tolist() == [10, 70, 130]


def test_greedy_with_controls_matches_reference(small_tiles: None, poisoned_allocations: None) -> None:
    rows, vocab = 6, 150
    logits, adjust = random_logits(rows, vocab, seed=2), adjustment(rows, vocab, seed=2)
    choice = TokenChoice(mask_token_id=0)
    chosen, confidence = lc.choose_tokens(logits, choice, adjust)
    want_chosen, want_confidence = reference.choose_tokens(reference.adjust_logits(logits, adjust), choice)
    # exact: token ids; the controls add a few terms per logit, and no two top logits lie that close
    assert torch.equal(chosen, want_chosen)
    assert chosen[-1] == vocab - 5 and confidence[-1] == 1.0  # the forced row
    torch.testing.assert_close(confidence, want_confidence, rtol=1e-5, atol=1e-6)  # as above


@pytest.mark.parametrize(("threshold", "controls"), [(0.3, False), (0.999, False), (0.5, True)])
def test_low_confidence_step_matches_reference(
    threshold: float, controls: bool, small_tiles: None, poisoned_allocations: None
) -> None:
    """Fill above the threshold, or the fallback; decided rows keep their token; done and fallback."""
    rows, vocab, mask = 7, 140, 139
    logits = random_logits(rows, vocab, seed=3, scale=4.0)
    decided = torch.tensor([False, True, False, False, True, False, False], device=DEVICE)
    tokens = torch.where(decided, torch.tensor([0, 12, 0, 0, 5, 0, 0], device=DEVICE), mask)
    adjust = adjustment(rows, vocab, seed=3) if controls else None
    choice = TokenChoice(mask_token_id=mask)
    want_tokens, want_decided = tokens.clone(), decided.clone()
    want = reference.low_confidence_step(logits, want_tokens, want_decided, choice, threshold, adjust)
    got = lc.low_confidence_step(logits, tokens, decided, choice, threshold, adjust)
    # exact: token ids and masks (no confidence at these seeds lies near the threshold)
    assert torch.equal(tokens, want_tokens) and torch.equal(decided, want_decided)
    assert torch.equal(got.fill, want.fill) and torch.equal(got.chosen, want.chosen)  # exact: as above
    assert bool(got.done) == bool(want.done) and bool(got.fallback) == bool(want.fallback)
    assert bool(got.fallback) == (threshold == 0.999)
    torch.testing.assert_close(got.confidence, want.confidence, rtol=1e-5, atol=1e-6)  # as above


def test_fallback_ties_and_done(poisoned_allocations: None) -> None:
    """Equal confidences everywhere: the lowest open row is filled; the last open row makes done."""
    logits = torch.zeros(4, 50, device=DEVICE)
    tokens = torch.full((4,), 49, device=DEVICE)
    decided = torch.tensor([True, False, False, True], device=DEVICE)
    result = lc.low_confidence_step(logits, tokens, decided, TokenChoice(mask_token_id=49), 0.9)
    assert decided.tolist() == [True, True, False, True] and bool(result.fallback) and not bool(result.done)
    assert tokens.tolist() == [49, 0, 49, 49]
    result = lc.low_confidence_step(logits, tokens, decided, TokenChoice(mask_token_id=49), 0.9)
    assert decided.all() and bool(result.done) and tokens.tolist() == [49, 0, 0, 49]


def test_sampling_follows_the_distribution() -> None:
    """Draws of many identical rows (temperature only) against the softmax, within 4.5 sigma."""
    vocab, rows, calls = 12, 64, 2
    base = random_logits(1, vocab, seed=4, scale=1.5)
    choice = TokenChoice(temperature=0.8, mask_token_id=11)
    seed = torch.tensor([5], device=DEVICE)
    draws = torch.cat([lc.choose_tokens(base.repeat(rows, 1), choice, seed=seed)[0] for _ in range(calls)])
    assert int(seed) == 5 + calls  # advanced once per call
    want = torch.softmax(
        reference.adjust_logits(base, None)[0].masked_fill(
            torch.arange(vocab, device=DEVICE) == 11, float("-inf")
        )
        / 0.8,
        -1,
    )
    seen = torch.bincount(draws, minlength=vocab).double() / draws.numel()
    assert seen[11] == 0
    n = draws.numel()
    for p, f in zip(want.tolist(), seen.tolist(), strict=True):
        assert abs(f - p) <= 4.5 * math.sqrt(p * (1 - p) / n) + 1e-3, (p, f)


@pytest.mark.parametrize("rule", ["probability", "sglang"])
def test_sampling_keeps_the_filtered_set_and_reports_its_probability(
    rule: str, small_tiles: None, poisoned_allocations: None
) -> None:
    """Top-k then top-p at temperature 0.7: every draw lies in the reference's kept set, and its
    confidence is the reference's number for that token under the rule."""
    rows, vocab = 5, 150
    logits = random_logits(rows, vocab, seed=6)
    adjust = adjustment(rows, vocab, seed=6)
    choice = TokenChoice(temperature=0.7, top_k=9, top_p=0.8, mask_token_id=1, confidence_rule=rule)
    chosen, confidence = lc.choose_tokens(logits, choice, adjust, seed=torch.tensor([11], device=DEVICE))
    controlled = reference.adjust_logits(logits, adjust)
    controlled[:, 1] = float("-inf")
    scaled = controlled / 0.7
    probs = torch.softmax(reference.filtered(scaled, 9, 0.8), -1)
    picked = probs.gather(1, chosen[:, None]).squeeze(1)
    assert (picked > 0).all()
    want = reference.commit_confidence(controlled, chosen, choice)
    # probabilities (after top-k/top-p renormalisation, or at temperature 1 for "sglang") in
    # float32, tiled: op order of the sums
    torch.testing.assert_close(confidence, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.6), (260, 0.9), (270, 1.0)])
def test_sampling_thresholds_by_bisection(top_k: int, top_p: float, poisoned_allocations: None) -> None:
    """No candidate list (no top-k, or one past MAX_TOP_K): the same kept set and probabilities."""
    rows, vocab = 3, 300
    logits = random_logits(rows, vocab, seed=top_k, scale=2.0)
    choice = TokenChoice(temperature=1.3, top_k=top_k, top_p=top_p, mask_token_id=0)
    chosen, confidence = lc.choose_tokens(logits, choice, seed=torch.tensor([2], device=DEVICE))
    scaled = (
        reference.adjust_logits(logits, None).index_fill(1, torch.tensor([0], device=DEVICE), float("-inf"))
        / 1.3
    )
    probs = torch.softmax(reference.filtered(scaled, top_k, top_p), -1)
    picked = probs.gather(1, chosen[:, None]).squeeze(1)
    assert (picked > 0).all()
    torch.testing.assert_close(confidence, picked, rtol=1e-5, atol=1e-6)  # as above


def test_same_seed_same_draws_and_a_missing_seed() -> None:
    logits = random_logits(4, 40, seed=7)
    choice = TokenChoice(temperature=1.0, top_k=5)
    first = lc.choose_tokens(logits, choice, seed=torch.tensor([9], device=DEVICE))[0]
    again = lc.choose_tokens(logits, choice, seed=torch.tensor([9], device=DEVICE))[0]
    assert torch.equal(first, again)  # exact: the same seeded draw, run twice
    with pytest.raises(ValueError, match="seed"):
        lc.choose_tokens(logits, choice)


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_sglang_rule_on_a_hand_computed_row(top_k: int, poisoned_allocations: None) -> None:
    """SGLang's min(p_argmax at temperature 1, exp((z - z_max) / T)) (the engine test of the same
    name cites SGLang's source): logits ln [4, 2, 1, 1] at T = 0.5 give p_argmax 0.5, so token 0
    commits at 0.5 and token 1 at exp(-2 ln 2) = 0.25, whatever top-k keeps."""
    rows = 32
    logits = torch.tensor([[4.0, 2.0, 1.0, 1.0]], device=DEVICE).log().repeat(rows, 1)
    choice = TokenChoice(temperature=0.5, top_k=top_k, confidence_rule="sglang")
    chosen, confidence = lc.choose_tokens(logits, choice, seed=torch.tensor([3], device=DEVICE))
    drawn = set(chosen.tolist())
    assert drawn == set(range(top_k))  # top-k 2: both kept tokens drawn (token 1 at 0.2, 32 rows)
    want = torch.tensor([0.5, 0.25], device=DEVICE)[chosen]
    # float32 logs and exponentials of powers of two, summed over tiles: a few ulp of numbers <= 1
    torch.testing.assert_close(confidence, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(  # as above
        confidence, reference.commit_confidence(logits, chosen, choice), rtol=1e-5, atol=1e-6
    )
