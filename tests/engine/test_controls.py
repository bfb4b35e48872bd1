"""Each logits control changes decoding the way it promises, and only in its phase."""

from __future__ import annotations

import functools
import math
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from clover_agent.engine.decoding.controls import MAX_LOOP_FACTOR, ControlTokens, LogitsControls, loop_factor
from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.sampling import SamplingParams
from tests.engine.decoding_helpers import EOS_ID, VOCAB, clover_from_hf, tiny_hf_model

PROMPT = list(range(5, 45))


@functools.cache
def decoder(seed: int = 0, lm_scale: float = 10.0, init_std: float = 0.15) -> BlockDecoder:
    return BlockDecoder(clover_from_hf(tiny_hf_model(seed, lm_scale=lm_scale, init_std=init_std)))


def test_default_parameters_leave_logits_untouched() -> None:
    controls = LogitsControls(
        SamplingParams(), ControlTokens(think_end=7, response_end=0), VOCAB, torch.device("cpu")
    )
    controls.observe([3, 3, 9])
    logits = torch.randn(4, VOCAB)
    assert not controls.active
    assert controls.apply(logits, [0, 1, 2, 3]) is logits


def test_repetition_penalty_matches_transformers_semantics() -> None:
    generated = [5, 9, 9, 200, 31]
    decided = [(5, 77)]
    logits = torch.randn(3, VOCAB) * 4
    params = SamplingParams(repetition_penalty=1.7)
    controls = LogitsControls(params, ControlTokens(None, None), VOCAB, torch.device("cpu"))
    controls.observe(generated)
    ours = controls.apply(logits, [6, 7, 8], decided)
    history = torch.tensor([[*generated, 77]] * 3)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(history, logits.clone())
    # one division or product per logit; a few ulps if the two spell it differently
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_presence_and_frequency_penalties_subtract_per_generated_token() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    controls = LogitsControls(params, ControlTokens(None, None), VOCAB, torch.device("cpu"))
    controls.observe([4, 4, 4, 8])
    logits = torch.zeros(1, VOCAB)
    out = controls.apply(logits, [4], [(4, 8)])
    assert out[0, 4] == pytest.approx(-(0.5 + 3 * 0.25))
    assert out[0, 8] == pytest.approx(-(0.5 + 2 * 0.25))
    assert out[0, 5] == 0.0


def repeats(tokens: list[int]) -> int:
    """Positions holding a token generated earlier in the output."""
    return len(tokens) - len(set(tokens))


def test_penalties_change_repeated_choices() -> None:
    # Autoregressive: every choice sees all earlier tokens, so a penalty removes repeats.
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=48, mode="autoregressive")).token_ids
    assert repeats(plain) > 0
    penalized = (
        decoder()
        .generate(PROMPT, SamplingParams(max_new_tokens=48, mode="autoregressive", repetition_penalty=3.0))
        .token_ids
    )
    assert repeats(penalized) < repeats(plain)
    # Diffusion: a pass sees the tokens decided before it (positions filled in the same pass can
    # still agree with each other), so penalties change the choices and reduce repeats.
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=96)).token_ids
    assert repeats(plain) > 0
    frequency = decoder().generate(PROMPT, SamplingParams(max_new_tokens=96, frequency_penalty=5.0)).token_ids
    assert repeats(frequency) < repeats(plain)
    repetition = (
        decoder().generate(PROMPT, SamplingParams(max_new_tokens=96, repetition_penalty=3.0)).token_ids
    )
    assert repetition != plain


def test_thinking_budget_ramp_closes_thinking_by_the_budget() -> None:
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=80))
    think_end = Counter(plain.token_ids).most_common(1)[0][0]  # a token the model emits often
    base = SamplingParams(max_new_tokens=80, thinking=True, think_end_token_id=think_end)
    # Thinking without a budget: at most one </think>.
    once = decoder().generate(PROMPT, base).token_ids
    assert once.count(think_end) <= 1
    # A token the model never emits here: the hard close puts it exactly at the budget...
    rare = next(t for t in range(1, VOCAB - 1) if t not in plain.token_ids)
    hard = (
        decoder()
        .generate(
            PROMPT, base.with_changes(think_end_token_id=rare, thinking_budget=40, thinking_ramp_strength=0.0)
        )
        .token_ids
    )
    assert hard.count(rare) == 1 and hard.index(rare) == 40
    # ...and a strong ramp from the start of the budget closes earlier, still only once.
    ramped = (
        decoder()
        .generate(
            PROMPT,
            base.with_changes(
                think_end_token_id=rare,
                thinking_budget=40,
                thinking_ramp_start=0.0,
                thinking_ramp_strength=40.0,
            ),
        )
        .token_ids
    )
    assert ramped.count(rare) == 1 and ramped.index(rare) < 40


def test_end_bias_closes_the_answer_before_the_limit() -> None:
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=96))
    assert plain.finish_reason == "length"
    biased = decoder().generate(
        PROMPT, SamplingParams(max_new_tokens=96, end_bias_start=0.5, end_bias_strength=40.0)
    )
    assert biased.finish_reason == "stop"  # the end token (config eos) was chosen
    assert 48 <= len(biased.token_ids) < 96
    # Blocks that end before the ramp starts (generated 0-23: the prompt's shared block) are untouched.
    assert biased.token_ids[:24] == plain.token_ids[:24]


def test_loop_detection_stops_or_penalizes_a_repeated_block() -> None:
    looping = decoder(seed=3, lm_scale=8.0, init_std=0.3)
    plain = looping.generate(PROMPT, SamplingParams(max_new_tokens=184))
    blocks = [tuple(plain.token_ids[i : i + 32]) for i in range(24, 184 - 31, 32)]
    first_repeat = next(i for i, block in enumerate(blocks) if block in blocks[:i])
    stopped = looping.generate(PROMPT, SamplingParams(max_new_tokens=184, loop_action="stop"))
    assert stopped.finish_reason == "loop"
    assert stopped.token_ids == plain.token_ids[: 24 + 32 * (first_repeat + 1)]
    penalized = looping.generate(PROMPT, SamplingParams(max_new_tokens=184, loop_action="penalize"))
    cut = 24 + 32 * (first_repeat + 1)
    assert penalized.token_ids[:cut] == plain.token_ids[:cut]
    assert penalized.token_ids[cut:] != plain.token_ids[cut:]


def test_controls_apply_in_the_causal_modes_too() -> None:
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=40, mode="autoregressive"))
    for mode in ("autoregressive", "self_speculative"):
        penalized = decoder().generate(
            PROMPT, SamplingParams(max_new_tokens=40, mode=mode, repetition_penalty=3.0)
        )
        assert penalized.token_ids != plain.token_ids
    # Lossless: self-speculative with controls equals autoregressive with the same controls.
    params = SamplingParams(max_new_tokens=40, repetition_penalty=3.0, stop_token_ids=(EOS_ID,))
    assert (
        decoder().generate(PROMPT, params.with_changes(mode="self_speculative")).token_ids
        == decoder().generate(PROMPT, params.with_changes(mode="autoregressive")).token_ids
    )


# ---- phases: a control changes nothing outside its phase ------------------------------------
THINK_END, RESPONSE_END = 7, 0
CPU = torch.device("cpu")


def controlled(
    params: SamplingParams,
    logits: torch.Tensor,
    *,
    tokens: ControlTokens = ControlTokens(THINK_END, RESPONSE_END),
    observed: list[int] | None = None,
    decided: list[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """``logits`` [n, V] for generated positions 0..n-1 after the controls of ``params``."""
    controls = LogitsControls(params, tokens, VOCAB, CPU)
    controls.observe(observed or [])
    return controls.apply(logits, list(range(logits.shape[0])), decided or [])


@pytest.mark.parametrize(
    ("fraction", "budget", "start"),
    [(0.5, 40, 20), (0.75, 10, 8), (0.57, 100, 57)],  # 0.75 * 10 = 7.5; 0.57 * 100 is 56.99... in floats
)
def test_think_end_ramp_has_no_effect_before_its_start(fraction: float, budget: int, start: int) -> None:
    params = SamplingParams(thinking=True, thinking_budget=budget, thinking_ramp_start=fraction)
    logits = torch.randn(budget, VOCAB)
    out = controlled(params, logits)
    assert torch.equal(out[:start], logits[:start])  # exact: bit-identical to no control at all
    assert bool((out[start:, THINK_END] > logits[start:, THINK_END]).all())
    others = torch.arange(VOCAB) != THINK_END
    assert torch.equal(out[:, others], logits[:, others])  # exact: untouched columns
    assert float(out[-1, THINK_END] - logits[-1, THINK_END]) == pytest.approx(params.thinking_ramp_strength)


def test_end_of_response_bias_does_not_act_inside_thinking() -> None:
    # The end ramp starts at position 0 at full strength, so it would change every answer row.
    ending = {"end_bias_start": 0.0, "end_bias_strength": 30.0, "max_new_tokens": 64}
    logits = torch.randn(64, VOCAB)
    biased = controlled(SamplingParams(**ending), logits)
    assert bool((biased[:, RESPONSE_END] > logits[:, RESPONSE_END]).all())
    # No </think> yet: every position is thinking.
    thinking = controlled(SamplingParams(thinking=True, **ending), logits)
    assert torch.equal(thinking, logits)  # exact: untouched
    # Thinking is over after a </think> (decided in this block, or already output) or after the
    # budget's hard close: only later rows get the end bias. The thinking controls' own effect is
    # the same with and without the end bias, so compare with the same thinking settings.
    cases = [
        ({"thinking": True}, {"decided": [(20, THINK_END)]}, 20),
        ({"thinking": True}, {"observed": [3] * 12 + [THINK_END]}, 12),
        ({"thinking": True, "thinking_budget": 30, "thinking_ramp_strength": 0.0}, {}, 30),
    ]
    for thinking, history, think_end_at in cases:
        without = controlled(SamplingParams(**thinking, max_new_tokens=64), logits, **history)
        with_end = controlled(SamplingParams(**thinking, **ending), logits, **history)
        # exact: the same thinking arithmetic on these rows, and no end bias added to them
        assert torch.equal(with_end[: think_end_at + 1], without[: think_end_at + 1]), thinking
        answer = with_end[think_end_at + 1 :, RESPONSE_END] > without[think_end_at + 1 :, RESPONSE_END]
        assert bool(answer.all()), thinking
    # A prompt that opened <think> on a vocabulary without </think>: the answer never provably
    # starts, so the end bias never acts.
    no_think_end = ControlTokens(think_end=None, response_end=RESPONSE_END)
    assert torch.equal(  # exact: untouched
        controlled(SamplingParams(thinking=True, **ending), logits, tokens=no_think_end), logits
    )


def test_penalties_at_their_neutral_values_leave_logits_bit_identical() -> None:
    history = [3, 3, 3, 9, 250, 9]
    logits = torch.randn(6, VOCAB) * 5
    # The end ramp is switched on but starts after the last position, so apply() runs its full path.
    neutral = SamplingParams(
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        loop_action="penalize",
        loop_penalty=1.0,
        end_bias_start=1.0,
        max_new_tokens=6,
    )
    controls = LogitsControls(neutral, ControlTokens(THINK_END, RESPONSE_END), VOCAB, CPU)
    assert controls.active
    controls.observe(history)
    for _ in range(3):  # a repeated block raises nothing at loop_penalty 1
        controls.observe_block(history)
    assert controls.repeats == 2
    out = controls.apply(logits, list(range(6, 12)), [(6, 9), (7, 40)])
    assert out is not logits and torch.equal(out, logits)  # exact: neutral values change no bit
    # loop_action="none" only counts repeats; "penalize" (default factor 1.3) changes repeated tokens.
    for action, changes in (("none", False), ("penalize", True)):
        controls = LogitsControls(SamplingParams(loop_action=action), ControlTokens(None, None), VOCAB, CPU)
        controls.observe(history)
        controls.observe_block(history)
        controls.observe_block(history)
        assert controls.repeats == 1
        assert (not torch.equal(controls.apply(logits[:1], [6]), logits[:1])) == changes  # exact: touched?


@pytest.mark.parametrize("mode", ["diffusion", "self_speculative", "autoregressive"])
def test_default_greedy_decode_equals_every_control_switched_off(mode: str) -> None:
    """The bare contract: default parameters, and every control switched on at a strength that
    does nothing, decode the same tokens in the same passes."""
    default = SamplingParams(max_new_tokens=56, mode=mode)
    switched_off = SamplingParams(
        max_new_tokens=56,
        mode=mode,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        end_bias_start=0.0,
        end_bias_strength=0.0,
        loop_action="penalize",
        loop_penalty=1.0,
        thinking=False,
        thinking_budget=None,
        stop_token_ids=(),
    )
    assert switched_off != default
    plain, off = decoder().generate(PROMPT, default), decoder().generate(PROMPT, switched_off)
    assert plain.token_ids == off.token_ids and len(plain.token_ids) > 32
    assert (plain.forwards, plain.steps_per_block, plain.fallback_steps, plain.finish_reason) == (
        off.forwards,
        off.steps_per_block,
        off.fallback_steps,
        off.finish_reason,
    )


def test_thinking_controls_leave_a_decode_untouched_before_their_phase() -> None:
    plain = decoder().generate(PROMPT, SamplingParams(max_new_tokens=96)).token_ids
    rare = next(t for t in range(1, VOCAB - 1) if t not in plain)  # a </think> the model never writes
    thinking = SamplingParams(max_new_tokens=96, thinking=True, think_end_token_id=rare)
    # Thinking without </think>: a strong end ramp from position 0 changes nothing.
    ended = decoder().generate(PROMPT, thinking.with_changes(end_bias_start=0.0, end_bias_strength=40.0))
    assert ended.token_ids == plain
    # The </think> ramp starts at generated position 60 (block 56-87): earlier blocks are untouched.
    ramped = decoder().generate(
        PROMPT,
        thinking.with_changes(thinking_budget=80, thinking_ramp_start=0.75, thinking_ramp_strength=40.0),
    )
    assert ramped.token_ids[:56] == plain[:56]
    assert rare in ramped.token_ids and 60 <= ramped.token_ids.index(rare) <= 80


@pytest.mark.parametrize("repeats", [400, 5000])
def test_the_loop_penalty_stays_finite_after_many_repeats(repeats: int) -> None:
    """1.3 ** 400 overflows float32 (the penalised logits were -inf, softmax NaN) and 1.3 ** 5000
    overflows a Python float: the factor is capped, and the choice stays the best unseen token."""
    seen = list(range(0, VOCAB, 2))
    logits = torch.empty(2, VOCAB)
    logits[:, 0::2] = torch.linspace(1.0, 10.0, len(seen))  # the repeated tokens led
    logits[:, 1::2] = torch.linspace(0.1, 0.9, VOCAB - len(seen))
    logits[1, 0::2] *= -5.0  # and in another row every repeated token is far below
    for loop_penalty in (1.3, 100.0):  # the default and serve's largest
        params = SamplingParams(loop_action="penalize", loop_penalty=loop_penalty, repetition_penalty=1.5)
        controls = LogitsControls(params, ControlTokens(None, None), VOCAB, CPU)
        controls.observe(seen)
        for _ in range(repeats + 1):
            controls.observe_block([7, 7, 7])
        assert controls.repeats == repeats
        out = controls.apply(logits, [len(seen), len(seen) + 1])
        assert torch.isfinite(out).all()
        assert controls.repetition_penalty == 1.5 * MAX_LOOP_FACTOR
        assert not torch.isnan(torch.softmax(out, dim=-1)).any()
        best_unseen = 2 * int(logits[0, 1::2].argmax()) + 1
        assert out.argmax(dim=-1).tolist() == [best_unseen, best_unseen]
        assert out[1, 0::2].max() < 0  # still penalised, in order
        assert torch.equal(out[1, 0::2].argsort(), logits[1, 0::2].argsort())  # exact: an order of indices
        adjustment = controls.adjustment([0], [0], [False])
        assert adjustment is not None and math.isfinite(adjustment.repetition_penalty)


def test_the_loop_factor_is_unchanged_below_its_cap() -> None:
    for repeats in range(0, 36):  # 1.3 ** 35 < MAX_LOOP_FACTOR < 1.3 ** 36
        assert loop_factor(1.3, repeats) == 1.3**repeats
    assert loop_factor(1.3, 36) == MAX_LOOP_FACTOR == loop_factor(1.3, 10**9)
    assert loop_factor(1.0, 10**9) == 1.0
