"""``Engine.generate`` / ``Engine.stream`` on a checkpoint folder with a tokenizer, and parameter
validation with clear messages."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest

from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, BlockProgress, GenerationDone
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint


@functools.cache
def engine(folder: Path) -> Engine:
    return Engine.from_pretrained(folder, progress=None)


def test_engine_generates_text_and_streams_the_same_tokens(checkpoint: Path) -> None:
    clover = engine(checkpoint)
    tokenizer = clover.tokenizer
    assert tokenizer is not None
    prompt = tokenizer.encode(
        tokenizer.render_chat([{"role": "user", "content": "def add(a, b):"}], add_generation_prompt=True)
    )
    params = SamplingParams(max_new_tokens=50)
    result = clover.generate(prompt, params)
    assert result.text == tokenizer.decode(result.token_ids)
    assert tokenizer.im_end_id not in result.token_ids  # <|im_end|> is a stop token
    events = list(clover.stream(prompt, params))
    assert isinstance(events[-1], GenerationDone) and events[-1].result.token_ids == result.token_ids
    pieces = [e.text for e in events if isinstance(e, BlockCommitted)]
    assert "".join(pieces) == result.text.rstrip("\ufffd")  # live text adds up to the answer
    assert any(isinstance(e, BlockProgress) for e in events)
    assert clover.generate(prompt).token_ids  # default parameters
    # The second identical call reuses the prompt's whole blocks from the engine's prefix cache.
    assert clover.generate(prompt, params).reused_tokens == len(prompt) // 32 * 32


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threshold": 0.0}, "threshold must be in \\(0, 1\\]"),
        ({"threshold": 1.5}, "threshold must be in \\(0, 1\\]"),
        ({"threshold": math.nan}, "threshold must be in \\(0, 1\\]"),
        ({"presence_penalty": -1.0}, "presence_penalty must be a finite number >= 0"),
        ({"frequency_penalty": -0.1}, "frequency_penalty must be a finite number >= 0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
        ({"repetition_penalty": -2.0}, "repetition_penalty must be a finite number > 0"),
        ({"temperature": -0.5}, "temperature must be"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
        ({"mode": "beam"}, "mode must be one of"),
        ({"thinking_budget": 10}, "thinking_budget needs thinking=True"),
    ],
)
def test_bad_sampling_parameters_raise_clear_errors(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**changes)


def test_bad_calls_raise_clear_errors(checkpoint: Path) -> None:
    clover = engine(checkpoint)
    assert SamplingParams(threshold=1.0).threshold == 1.0  # the closed end of (0, 1]
    with pytest.raises(ValueError, match="prompt is empty"):
        clover.generate([], SamplingParams())
    window = clover.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"context window is {window}"):
        clover.generate([1] * window, SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        clover.stream([clover.config.vocab_size], SamplingParams())
    # A stop or </think> id the vocabulary lacks could never be produced; as the response end the
    # controls steer towards it, it failed mid-call with an IndexError: it is named up front.
    vocab = clover.config.vocab_size
    with pytest.raises(
        ValueError, match=rf"stop_token_ids outside the vocabulary \[0, {vocab}\): \[{vocab}\]"
    ):
        clover.stream([1, 2], SamplingParams(stop_token_ids=(vocab,), end_bias_start=0.5))
    with pytest.raises(ValueError, match="think_end_token_id outside the vocabulary"):
        clover.stream([1, 2], SamplingParams(thinking=True, think_end_token_id=vocab + 5))
    with pytest.raises(ValueError, match="differs from the checkpoint's block_size"):
        clover.generate([1, 2], SamplingParams(block_size=16))


def test_a_checkpoint_without_mask_token_only_decodes_autoregressively(tmp_path: Path) -> None:
    folder = write_tiny_checkpoint(tmp_path / "plain", peaked=True, tokenizer=False)
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.replace('"mask_token_id"', '"unused_mask_token_id"'))
    plain = Engine.from_pretrained(folder, progress=None)
    assert plain.config.mask_token_id is None
    with pytest.raises(ValueError, match="no mask_token_id"):
        plain.generate([1, 2, 3], SamplingParams())
    result = plain.generate([1, 2, 3], SamplingParams(max_new_tokens=5, mode="autoregressive"))
    assert result.text is None and 0 < len(result.token_ids) <= 5


def test_contract_defaults_and_a_checkpoint_that_overrides_them(tmp_path: Path) -> None:
    params = SamplingParams()
    assert (params.block_size, params.threshold, params.temperature) == (32, 0.95, 0.0)
    # A checkpoint whose config.json sets block_size 16 and threshold 1.0 (nothing is strictly above
    # 1.0, so every pass is a fallback that fills one position).
    folder = write_tiny_checkpoint(
        tmp_path / "b16", peaked=True, tokenizer=False, overrides={"block_size": 16, "threshold": 1.0}
    )
    clover = Engine.from_pretrained(folder, progress=None)
    assert (clover.default_params().block_size, clover.default_params().threshold) == (16, 1.0)
    coding = SamplingParams.coding(clover.config, max_new_tokens=9)
    assert (coding.block_size, coding.threshold, coding.temperature, coding.max_new_tokens) == (
        16,
        1.0,
        0.6,
        9,
    )
    assert SamplingParams.for_model(clover.config, threshold=0.5).threshold == 0.5  # explicit values win
    result = clover.generate([5, 6, 7])  # no parameters: the checkpoint's
    assert result.steps_per_block[0] == 16 - 3 or result.finish_reason == "stop"
    assert result.fallback_steps == sum(result.steps_per_block) > 0
    with pytest.raises(ValueError, match="block_size 32 differs from the checkpoint's block_size 16"):
        clover.generate([5, 6, 7], SamplingParams(max_new_tokens=4))
