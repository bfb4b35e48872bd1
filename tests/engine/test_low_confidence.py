"""LowConfidence's rules on hand-made confidences: strictly above the threshold, else the single
most confident position with ties to the lowest index; the mask token is never chosen. The commit
confidence rules: one definition per name in the engine and the kernels' reference, the "sglang"
one pinned to SGLang's source."""

from __future__ import annotations

import math

import pytest
import torch

from clover_agent.engine.decoding import sampling
from clover_agent.engine.decoding.choice import choose_tokens, commit_confidence, low_confidence_fill
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.kernels.low_confidence import reference
from clover_agent.kernels.low_confidence.reference import TokenChoice


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


# ---- the commit confidence rules: one definition per name (engine and kernels' reference) ----

SGLANG_SAMPLING = (
    "https://github.com/sgl-project/sglang/blob/f7fd34f962a825da42f7db142271b41369195f71/"
    "python/sglang/srt/dllm/sampling.py"
)


def test_the_engine_and_the_kernels_name_the_same_rules() -> None:
    assert sampling.CONFIDENCE_RULES == reference.CONFIDENCE_RULES == ("probability", "sglang")


@pytest.mark.parametrize("rule", sampling.CONFIDENCE_RULES)
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.0, 0, 1.0), (0.6, 0, 1.0), (0.6, 20, 0.95), (1.3, 5, 1.0), (0.7, 0, 0.8), (0.5, 1, 1.0)],
)
def test_engine_and_kernel_reference_give_the_same_confidences(
    rule: str, temperature: float, top_k: int, top_p: float
) -> None:
    """The same logits, tokens and parameters give the same commit confidence in
    ``engine/decoding/choice.py`` and ``kernels/low_confidence/reference.py``: for the engine's own
    draws and for the reference's."""
    mask = 3
    logits = torch.randn(16, 64, generator=torch.Generator().manual_seed(7)) * 3.0
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, confidence=rule)
    choice = TokenChoice(
        temperature=temperature, top_k=top_k, top_p=top_p, mask_token_id=mask, confidence_rule=rule
    )
    masked = logits.index_fill(1, torch.tensor([mask]), float("-inf"))
    tokens, confidence = choose_tokens(logits, params, mask, torch.Generator().manual_seed(1))
    ref_tokens, ref_confidence = reference.choose_tokens(logits, choice, torch.Generator().manual_seed(2))
    # float32 probabilities (each <= 1) of the same logits by other op orders (logsumexp against
    # softmax; top-k values against a masked row; the nucleus's cumulative sums): a few ulp
    torch.testing.assert_close(
        confidence, reference.commit_confidence(masked, tokens, choice), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(  # as above
        commit_confidence(masked, ref_tokens, params), ref_confidence, rtol=1e-5, atol=1e-6
    )


def test_the_sglang_rule_on_a_hand_computed_row() -> None:
    """SGLang's dLLM sampling confidence, ``DllmSamplingPlan.sample`` / ``.confidence`` in
    python/sglang/srt/dllm/sampling.py at f7fd34f962a825da42f7db142271b41369195f71 (the URL is
    ``SGLANG_SAMPLING``): ``min(argmax_probs, exp((z_t - z_max) / T))``, argmax_probs being the
    greedy path's confidence, the softmax at temperature 1 of the unfiltered logits at the argmax
    (``LowConfidence.step``, python/sglang/srt/dllm/algorithm/low_confidence.py at 0564b5215b33);
    the draw's own top-k / top-p filtering does not enter.

    Logits ln [4, 2, 1, 1] at T = 0.5, top-k 2: p_argmax = 4/8 = 0.5; token 0: min(0.5, 1) = 0.5;
    token 1: min(0.5, exp(-2 ln 2)) = 0.25; token 2: min(0.5, exp(-4 ln 2)) = 0.0625 (not drawable
    under top-k 2, yet the rule is defined on it). The "probability" rule gives the filtered,
    renormalised 4^2 : 2^2 = 16 : 4, that is 0.8 and 0.2, and 0 for token 2."""
    assert SGLANG_SAMPLING.endswith("python/sglang/srt/dllm/sampling.py")
    logits = torch.tensor([[4.0, 2.0, 1.0, 1.0]]).log().repeat(3, 1)
    tokens = torch.tensor([0, 1, 2])
    for rule, want in (("sglang", [0.5, 0.25, 0.0625]), ("probability", [0.8, 0.2, 0.0])):
        params = SamplingParams(temperature=0.5, top_k=2, confidence=rule)
        choice = TokenChoice(temperature=0.5, top_k=2, confidence_rule=rule)
        expected = torch.tensor(want)
        # float32 logs and exponentials of powers of two: a few ulp of numbers <= 1
        torch.testing.assert_close(commit_confidence(logits, tokens, params), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(  # as above
            reference.commit_confidence(logits, tokens, choice), expected, rtol=1e-5, atol=1e-6
        )


def test_top_k_one_commits_on_greedy_confidence_under_the_sglang_rule() -> None:
    """A draw that can only be the argmax commits at p_argmax (temperature 1) under "sglang", as
    SGLang's greedy path does, and at 1 under "probability" (its filtered distribution is one token)."""
    logits = torch.tensor([[4.0, 2.0, 1.0, 1.0]]).log()
    for rule, want in (("sglang", 0.5), ("probability", 1.0)):
        params = SamplingParams(temperature=0.5, top_k=1, confidence=rule)
        tokens, confidence = choose_tokens(logits, params, None, torch.Generator().manual_seed(0))
        assert tokens.tolist() == [0]
        assert math.isclose(confidence.item(), want, rel_tol=1e-6)


def test_earlier_rule_names_are_accepted_and_stored_as_the_current_ones() -> None:
    assert SamplingParams(temperature=1.0, confidence="relative").confidence == "sglang"
    assert SamplingParams(temperature=1.0, confidence="drawn").confidence == "probability"
    assert SamplingParams().confidence == "probability"
    with pytest.raises(ValueError, match="probability, sglang, drawn, relative"):
        SamplingParams(confidence="entropy")
