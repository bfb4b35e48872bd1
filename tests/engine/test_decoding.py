"""Block-diffusion decoding against the full-recompute oracle, plus the causal modes against
``transformers``' greedy ``generate`` and the state-commit accounting."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, BlockProgress, GenerationDone
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from tests.engine.decoding_helpers import (
    BLOCK,
    EOS_ID,
    MASK_ID,
    ReferenceSampling,
    chain_hf_model,
    clover_from_hf,
    reference_diffusion_decode,
    tiny_hf_model,
)


@functools.cache
def models(seed: int = 0):
    hf = tiny_hf_model(seed, lm_scale=10.0)
    return hf, clover_from_hf(hf)


def prompt_of(length: int, seed: int = 1) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, MASK_ID, (length,), generator=generator).tolist()


@pytest.mark.parametrize("prompt_length", [32, 40, 71])
@pytest.mark.parametrize("threshold", [0.95, 0.5])
def test_greedy_diffusion_equals_full_recompute(prompt_length: int, threshold: float) -> None:
    hf, model = models()
    prompt = prompt_of(prompt_length)
    max_new = 70  # not a multiple of 32: the last block is decoded whole and trimmed
    result = BlockDecoder(model).generate(prompt, SamplingParams(max_new_tokens=max_new, threshold=threshold))
    expected, reference_steps = reference_diffusion_decode(hf, prompt, max_new, threshold=threshold)
    assert result.token_ids == expected
    assert result.finish_reason == ("length" if len(expected) == max_new else "stop")
    # Every block but the last (which may end early, once the positions within the limit are decided)
    # took as many passes as in the reference.
    assert result.steps_per_block[:-1] == reference_steps[: len(result.steps_per_block) - 1]
    # Peaked distributions: some passes fill several positions at once.
    slots = [BLOCK - prompt_length % BLOCK] + [BLOCK] * (len(result.steps_per_block) - 1)
    assert any(steps < n for steps, n in zip(result.steps_per_block, slots, strict=True))
    assert result.forwards == sum(result.steps_per_block) + len(result.steps_per_block) - 1 + (
        prompt_length >= BLOCK
    )


def test_stop_token_mid_block_ends_the_output() -> None:
    hf, model = models()
    prompt = prompt_of(40)
    free, _ = reference_diffusion_decode(hf, prompt, 96)
    # A token whose first occurrence is in the middle of a block (generated index 30 is position 70).
    index = next(
        i for i in range(len(free)) if 4 <= (40 + i) % BLOCK <= 28 and free[i] not in free[:i] and i > 24
    )
    stop = free[index]
    params = SamplingParams(max_new_tokens=96, stop_token_ids=(stop,))
    result = BlockDecoder(model).generate(prompt, params)
    expected, _ = reference_diffusion_decode(hf, prompt, 96, stop_ids=(EOS_ID, stop))
    assert result.token_ids == expected == free[:index]
    assert result.finish_reason == "stop"
    assert stop not in result.token_ids


def test_one_commit_per_committed_block_and_none_while_denoising() -> None:
    _, model = models()
    prompt = prompt_of(70)  # two whole prompt blocks (one prefill commit) and a 6-token tail
    calls: list[tuple[int, bool | int]] = []  # (commits the pass made, its commit argument)
    before: list[int] = []

    def pre_hook(module, args, kwargs):
        before.append(args[1].commits)

    def hook(module, args, kwargs, output):
        calls.append((args[1].commits - before[-1], kwargs.get("commit", False)))

    handles = [
        model.register_forward_pre_hook(pre_hook, with_kwargs=True),
        model.register_forward_hook(hook, with_kwargs=True),
    ]
    try:
        events = list(BlockDecoder(model).stream(prompt, SamplingParams(max_new_tokens=100)))
    finally:
        for handle in handles:
            handle.remove()
    result = events[-1].result
    committed_blocks = [e for e in events if isinstance(e, BlockCommitted)]
    # Prefill: one commit; denoise passes: none; each finished block but the last: exactly one.
    denoise = [delta for delta, commit in calls if commit is False]
    assert denoise and all(delta == 0 for delta in denoise)
    assert [delta for delta, commit in calls if commit is not False] == [1] * len(committed_blocks)
    assert result.commits == len(committed_blocks)
    assert result.forwards == len(calls)
    provisional = [e for e in events if isinstance(e, BlockProgress)]
    assert len(provisional) == sum(result.steps_per_block)
    assert all(e.token_ids[i] != MASK_ID for e in provisional for i, f in enumerate(e.filled) if f)


@pytest.mark.slow
def test_causal_modes_equal_transformers_greedy_generate() -> None:
    hf, model = models()
    decoder = BlockDecoder(model)
    # 32: the pending prompt tail fills a block (draft the next one); 45: a 13-token tail.
    for prompt_length in (32, 45):
        prompt = prompt_of(prompt_length, seed=prompt_length)
        ids = torch.tensor([prompt])
        expected = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=44, do_sample=False, eos_token_id=None
        )[0, prompt_length:].tolist()
        for mode in ("self_speculative", "autoregressive"):
            result = decoder.generate(prompt, SamplingParams(max_new_tokens=44, mode=mode, stop_token_ids=()))
            assert result.token_ids == expected[: len(result.token_ids)], mode
            if EOS_ID not in expected:
                assert result.token_ids == expected
            assert 0 < result.tokens_per_forward <= BLOCK
        assert result.forwards == len(result.token_ids) + (prompt_length > BLOCK)  # autoregressive


@pytest.mark.parametrize("prompt", [[5, 6, 7, 8], [*range(5, 25), *range(5, 25), 5, 5, 5]])
def test_self_speculative_accepts_agreeing_drafts_and_stays_lossless(prompt: list[int]) -> None:
    hf = chain_hf_model()
    ids = torch.tensor([prompt])
    expected = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=70, do_sample=False, eos_token_id=None
    )[0, len(prompt) :].tolist()
    decoder = BlockDecoder(clover_from_hf(hf))
    result = decoder.generate(prompt, SamplingParams(max_new_tokens=70, mode="self_speculative"))
    assert result.token_ids == expected
    assert result.tokens_per_forward > 1.5  # whole drafts were accepted once the chain settled
    # State advanced over accepted tokens only, in whole blocks: never past what is known.
    assert result.commits == (len(prompt) + len(expected) - 1) // BLOCK - (len(prompt) - 1) // BLOCK + (
        len(prompt) > BLOCK
    )


def test_sampling_is_reproducible_with_a_seed_and_varies_across_seeds() -> None:
    _, model = models()
    decoder = BlockDecoder(model)
    prompt = prompt_of(40)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95, top_k=20, seed=7)
    first = decoder.generate(prompt, params).token_ids
    assert decoder.generate(prompt, params).token_ids == first
    others = {tuple(decoder.generate(prompt, params.with_changes(seed=s)).token_ids) for s in (8, 9)}
    assert len(others | {tuple(first)}) > 1
    greedy = decoder.generate(prompt, SamplingParams(max_new_tokens=24)).token_ids
    assert first != greedy
    assert MASK_ID not in first


def test_stream_reports_text_free_events_and_final_statistics() -> None:
    _, model = models()
    events = list(BlockDecoder(model).stream(prompt_of(33), SamplingParams(max_new_tokens=40)))
    assert isinstance(events[-1], GenerationDone)
    result = events[-1].result
    streamed = [t for e in events if isinstance(e, BlockCommitted) for t in e.token_ids]
    assert streamed == result.token_ids
    stats = result.stats()
    assert stats["tokens"] == len(result.token_ids)
    assert stats["forwards"] == result.forwards
    assert stats["tokens_per_forward"] == pytest.approx(len(result.token_ids) / result.forwards, abs=1e-4)
    assert 0.0 <= stats["fallback_rate"] <= 1.0


@pytest.mark.parametrize(
    ("bidirectional", "causal_context", "fuse_commit"),
    [(False, False, False), (True, False, False), (True, False, True), (True, True, True)],
)
def test_cached_decoding_equals_cache_free_recompute_on_written_checkpoints(
    bidirectional: bool, causal_context: bool, fuse_commit: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Checkpoints with the bidirectional GDN tensors are beyond transformers; the oracle here is the
    engine's own model re-run over the whole sequence from an empty cache at every step, which
    checks everything the caches and commit passes (fused or not) add."""
    folder = write_tiny_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny",
        peaked=True,
        seed=8,
        bidirectional=bidirectional,
        tokenizer=False,
    )
    engine = Engine.from_pretrained(folder, progress=None)
    model, config = engine.model, engine.config
    assert config.bidirectional_gdn is bidirectional

    def full_recompute(tokens: list[int], block_start: int) -> torch.Tensor:
        causal = block_start if causal_context else 0
        return model(torch.tensor(tokens), model.new_cache(), attention="block", causal_prefix=causal)

    prompt = torch.randint(1, 500, (45,), generator=torch.Generator().manual_seed(4)).tolist()
    stops = tuple(config.eos_token_id)
    params = SamplingParams(max_new_tokens=60, causal_context=causal_context, fuse_commit=fuse_commit)
    result = engine.generate(prompt, params)
    expected, _ = reference_diffusion_decode(
        full_recompute, prompt, 60, stop_ids=stops, mask_id=config.mask_token_id
    )
    assert result.token_ids == expected
    assert len(result.steps_per_block) >= 2  # at least one commit was relied on


def test_blocks_are_aligned_and_the_last_is_decoded_whole_then_trimmed() -> None:
    _, model = models()
    prompt = prompt_of(40)  # 8 prompt tokens share the first block with 24 generated slots
    max_new = 24 + 32 + 5  # the third block is the last: all 32 slots decoded, 5 kept
    events = list(
        BlockDecoder(model).stream(prompt, SamplingParams(max_new_tokens=max_new, stop_token_ids=()))
    )
    result = events[-1].result
    first_pass = {}  # block -> its first provisional state
    for event in events:
        if isinstance(event, BlockProgress):
            first_pass.setdefault(event.block, event)
    assert (first_pass[0].position, len(first_pass[0].token_ids)) == (40, 24)
    # block 0 covers positions 32-63; each later one starts at the next multiple of 32
    assert all(first_pass[b].position == BLOCK * (b + 1) for b in first_pass if b > 0)
    if result.finish_reason == "length":  # the tiny model did not end the answer on its own
        assert sorted(first_pass) == [0, 1, 2]
        assert len(first_pass[2].token_ids) == 32  # decoded whole, as in training
        assert len(result.token_ids) == max_new


def test_a_decided_stop_ends_the_call_at_once_without_a_commit_pass() -> None:
    """As soon as a stop token and every position before it are decided, the call ends: later
    positions of the block may still be masked, and that block is never committed."""
    _, model = models()
    prompt = prompt_of(40)
    free = (
        BlockDecoder(model).generate(prompt, SamplingParams(max_new_tokens=96, stop_token_ids=())).token_ids
    )
    index = next(i for i in range(30, len(free)) if free[i] not in free[:i] and (40 + i) % BLOCK < BLOCK - 4)
    stop = free[index]
    events = list(
        BlockDecoder(model).stream(prompt, SamplingParams(max_new_tokens=96, stop_token_ids=(stop,)))
    )
    result = events[-1].result
    assert result.token_ids == free[:index] and result.finish_reason == "stop"
    last_block = [e for e in events if isinstance(e, BlockProgress) and e.block == events[-2].block]

    def settled(event: BlockProgress) -> bool:
        k = next((i for i, t in enumerate(event.token_ids) if event.filled[i] and t == stop), None)
        return k is not None and all(event.filled[:k])

    assert settled(last_block[-1]) and not any(settled(e) for e in last_block[:-1])
    assert not all(last_block[-1].filled)  # here a position after the stop was still masked
    # Commits: the prefill and each block before the last; none for the block holding the stop.
    assert result.commits == 1 + (len(result.steps_per_block) - 1)
    assert result.forwards == sum(result.steps_per_block) + result.commits


def test_im_end_from_the_tokenizer_is_a_stop_token(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A checkpoint whose config.json lists only <|endoftext|> still stops at <|im_end|>: the engine
    adds it from the tokenizer. Shown by steering the answer to <|im_end|> with the end bias."""
    folder = write_tiny_checkpoint(tmp_path_factory.mktemp("imend") / "tiny", peaked=True, seed=3)
    endoftext = Engine.from_pretrained(folder, progress=None).tokenizer.token_id("<|endoftext|>")
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"eos_token_id"', '"unused_eos"'))
    data = json.loads(config.read_text())
    data["eos_token_id"] = [endoftext]
    config.write_text(json.dumps(data))
    engine = Engine.from_pretrained(folder, progress=None)
    im_end = engine.tokenizer.im_end_id
    assert engine.config.eos_token_id == [endoftext] and im_end is not None
    steer = {"max_new_tokens": 40, "end_bias_start": 0.0, "end_bias_strength": 1e4}
    # Without a tokenizer the decoder knows <|im_end|> only when told; the engine knows it by itself.
    told = BlockDecoder(engine.model).generate(
        [5, 6, 7], engine.default_params(stop_token_ids=(im_end,), **steer)
    )
    by_itself = engine.generate([5, 6, 7], engine.default_params(**steer))
    assert told.finish_reason == by_itself.finish_reason == "stop"
    assert by_itself.token_ids == told.token_ids and im_end not in by_itself.token_ids
    assert len(told.token_ids) < 40
    # ignore_eos: the same steering, and the answer runs to its length with the end tokens in it
    through = engine.generate([5, 6, 7], engine.default_params(ignore_eos=True, **steer))
    assert through.finish_reason == "length" and len(through.token_ids) == 40
    assert through.token_ids[: len(told.token_ids)] == told.token_ids and im_end in through.token_ids


@functools.cache
def context_models():
    """Attention before the last layer, so the context's encoding reaches the block's logits."""
    layers = ["full_attention", "linear_attention", "full_attention", "linear_attention"]
    hf = tiny_hf_model(0, lm_scale=10.0, layer_types=layers)
    return hf, clover_from_hf(hf)


@pytest.mark.parametrize("fuse_commit", [False, True])
@pytest.mark.parametrize("causal_context", [False, True])
@pytest.mark.parametrize("prompt_length", [40, 71])
def test_diffusion_options_equal_full_recompute(
    prompt_length: int, causal_context: bool, fuse_commit: bool
) -> None:
    """A commit fused into the next block's first pass changes no token; a causally encoded context
    matches the oracle whose context rows attend causally."""
    hf, model = context_models()
    prompt = prompt_of(prompt_length)
    params = SamplingParams(max_new_tokens=70, causal_context=causal_context, fuse_commit=fuse_commit)
    result = BlockDecoder(model).generate(prompt, params)
    expected, reference_steps = reference_diffusion_decode(hf, prompt, 70, causal_context=causal_context)
    assert result.token_ids == expected
    blocks = len(result.steps_per_block)
    assert result.steps_per_block[:-1] == reference_steps[: blocks - 1]
    prefill = int(prompt_length >= BLOCK)
    assert result.commits == prefill + blocks - 1
    # Fused: every commit but the prefill rides on a denoising pass.
    commit_passes = 0 if fuse_commit else blocks - 1
    assert result.forwards == prefill + sum(result.steps_per_block) + commit_passes


def test_a_causal_context_is_a_different_encoding() -> None:
    """The option's oracle differs from the block-causal one here, so the test above can tell them apart."""
    hf, _ = context_models()
    prompt = prompt_of(71)
    block, _ = reference_diffusion_decode(hf, prompt, 70)
    causal, _ = reference_diffusion_decode(hf, prompt, 70, causal_context=True)
    assert block != causal


@pytest.mark.parametrize("rule", ["probability", "sglang"])
def test_sampled_diffusion_equals_full_recompute_under_each_confidence_rule(rule: str) -> None:
    hf, model = models()
    prompt = prompt_of(40)
    params = SamplingParams(
        max_new_tokens=56, temperature=0.7, top_k=20, top_p=0.9, seed=5, threshold=0.8, confidence=rule
    )
    result = BlockDecoder(model).generate(prompt, params)
    sampling = ReferenceSampling(temperature=0.7, top_k=20, top_p=0.9, rule=rule, seed=5)
    expected, reference_steps = reference_diffusion_decode(hf, prompt, 56, threshold=0.8, sampling=sampling)
    assert result.token_ids == expected
    assert result.steps_per_block[:-1] == reference_steps[: len(result.steps_per_block) - 1]


def test_the_confidence_rules_decide_differently() -> None:
    """So the test above tells the rules apart: same draws' seed, other fill decisions."""
    hf, _ = models()
    prompt = prompt_of(40)
    decodes = {
        rule: reference_diffusion_decode(
            hf, prompt, 56, threshold=0.8, sampling=ReferenceSampling(0.7, 20, 0.9, rule=rule, seed=5)
        )
        for rule in ("probability", "sglang")
    }
    assert decodes["probability"] != decodes["sglang"]


def test_autoregressive_sampling_follows_transformers_warper_order() -> None:
    """T != 1 with top-k and top-p: each token is a draw from temperature -> top-k -> top-p of the
    causal logits, as transformers' warpers compute it, from the call's seeded generator."""
    hf, model = models()
    prompt = prompt_of(37)
    params = SamplingParams(
        max_new_tokens=24, mode="autoregressive", temperature=1.5, top_k=30, top_p=0.8, seed=11
    )
    result = BlockDecoder(model).generate(prompt, params)
    sampling = ReferenceSampling(temperature=1.5, top_k=30, top_p=0.8, seed=11)
    generator = torch.Generator().manual_seed(11)
    sequence, expected = list(prompt), []
    with torch.no_grad():
        while len(expected) < 24:
            logits = hf(torch.tensor([sequence])).logits[0, -1:].float()
            logits[:, MASK_ID] = float("-inf")
            token = int(sampling.choose(logits, generator)[0][0])
            if token == EOS_ID:
                break
            expected.append(token)
            sequence.append(token)
    assert result.token_ids == expected
    greedy = BlockDecoder(model).generate(prompt, SamplingParams(max_new_tokens=24, mode="autoregressive"))
    assert greedy.token_ids != expected  # the draws mattered


@pytest.mark.parametrize(("prompt", "stop", "expected"), [([5, 6, 7, 8], 15, 6), ([20, 21, 22, 23], 25, 1)])
def test_self_speculative_stops_like_autoregressive_decoding(
    prompt: list[int], stop: int, expected: int
) -> None:
    """A stop token ends the output right before it, as in autoregressive decoding: the verify's own
    choice (15, after rejected drafts), and a stop accepted after an accepted draft token (24 is
    drafted and accepted after 23; 25, the stop, follows it)."""
    decoder = BlockDecoder(clover_from_hf(chain_hf_model(last_followed_by=25)))
    params = SamplingParams(max_new_tokens=70, stop_token_ids=(stop,))
    events = list(decoder.stream(prompt, params.with_changes(mode="self_speculative")))
    speculative = events[-1].result
    autoregressive = decoder.generate(prompt, params.with_changes(mode="autoregressive"))
    assert speculative.token_ids == autoregressive.token_ids
    assert speculative.finish_reason == autoregressive.finish_reason == "stop"
    assert len(speculative.token_ids) == expected and stop not in speculative.token_ids
    if stop == 25:
        assert speculative.token_ids == [24] and speculative.forwards == 2  # one draft + one verify
        assert [e.token_ids for e in events if isinstance(e, BlockCommitted)] == [[24]]
