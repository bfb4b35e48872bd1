"""``CloverModel.forward_packed``: many requests' forwards as one batch equal each request's own
forward, logits and caches, and requests that keep decoding on packed forwards choose the same
tokens (docs/decoding.md, "Batched forwards")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.loading.weights import load_model
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.model.packed import Segment

#: A float64 model still runs the Gated DeltaNet core in float32 (its state is float32), and the
#: folded call rounds it in another order than the single one (~1e-7 relative). Peaked logits reach
#: ~100, so 2e-3 absolute leaves a wide margin over the 4e-5 seen; states are O(1): 1e-5.
LOGITS = (1e-5, 2e-3)  # (rtol, atol)
STATE = (1e-5, 1e-5)
VOCAB = 500  # ids below the mask token of the small vocabulary


@dataclasses.dataclass(frozen=True)
class Case:
    """One segment: a cache holding ``past`` committed tokens, then a forward over ``steps``."""

    past: int
    steps: int
    attention: str = "block"
    commit: bool | int = False
    causal_prefix: int = 0
    logit_rows: int | None = None


#: Mixed segments: different cache lengths and token counts, both attention rules, commits and
#: none, a fused causal-context commit, logit rows 0 / None / n, and shapes that repeat (several
#: 32-token denoising passes after different contexts fold into one GDN call).
MIXED = [
    Case(0, 32, commit=True, logit_rows=0),  # a prefill block
    Case(32, 32),
    Case(96, 32),
    Case(64, 32),
    Case(32, 32, commit=True, logit_rows=0),  # commit passes
    Case(64, 32, commit=True, logit_rows=0),
    Case(32, 64, commit=32, causal_prefix=32, logit_rows=32),  # causal context fused with the next block
    Case(96, 64, commit=32, causal_prefix=32, logit_rows=32),  # ... twice: folded around the state between
    Case(64, 64, commit=32, logit_rows=32),  # a fused commit
    Case(37, 5, attention="causal", commit=3, logit_rows=2),  # a verify keeping 3 tokens
    Case(32, 1, attention="causal", commit=True),  # an autoregressive step
    Case(0, 45, attention="causal", logit_rows=1),
]


def _model(path: Path, dtype: torch.dtype, kernels: str = "torch", experts: str = "auto") -> CloverModel:
    model, _ = load_model(path, dtype=dtype, kernels=kernels, progress=None, experts=experts)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Peaked tiny checkpoints with and without the bidirectional GDN tensors."""
    root = tmp_path_factory.mktemp("packed")
    return {
        bidirectional: write_tiny_checkpoint(
            root / f"bidirectional-{bidirectional}",
            bidirectional=bidirectional,
            peaked=True,
            seed=5,
            tokenizer=False,
        )
        for bidirectional in (False, True)
    }


def _segments(model: CloverModel, cases: Sequence[Case], seed: int) -> list[Segment]:
    """Each case's segment, on a cache that committed ``past`` random tokens (whole blocks first)."""
    generator = torch.Generator().manual_seed(seed)
    segments = []
    for case in cases:
        cache = model.new_cache(256)
        whole = case.past - case.past % model.config.block_size
        for start, end, attention in ((0, whole, "block"), (whole, case.past, "causal")):
            if end > start:
                ids = torch.randint(0, VOCAB, (end - start,), generator=generator).tolist()
                model(ids, cache, attention=attention, commit=True, logit_rows=0)
        ids = torch.randint(0, VOCAB, (case.steps,), generator=generator).tolist()
        segments.append(
            Segment(ids, cache, case.attention, case.commit, case.causal_prefix, case.logit_rows)  # type: ignore[arg-type]
        )
    return segments


def _one_by_one(model: CloverModel, segments: Sequence[Segment]) -> list[torch.Tensor]:
    return [
        model(
            s.input_ids,
            s.cache,
            attention=s.attention,
            commit=s.commit,
            causal_prefix=s.causal_prefix,
            logit_rows=s.logit_rows,
        )
        for s in segments
    ]


def _copies(segments: Sequence[Segment]) -> list[Segment]:
    return [dataclasses.replace(s, cache=s.cache.clone(256)) for s in segments]


def _assert_same(
    model: CloverModel,
    segments: Sequence[Segment],
    logits: tuple[float, float],
    state: tuple[float, float],
) -> list[torch.Tensor]:
    """forward_packed on ``segments`` against each forward on copies of their caches; tolerances
    (rtol, atol) for the logits and the state."""
    alone = _copies(segments)
    expected = _one_by_one(model, alone)
    got = model.forward_packed(segments)
    assert len(got) == len(segments)
    for packed, single, mine, theirs in zip(got, expected, segments, alone, strict=True):
        assert packed.shape == single.shape and packed.dtype == torch.float32
        torch.testing.assert_close(packed, single, rtol=logits[0], atol=logits[1])
        assert (mine.cache.length, mine.cache.commits) == (theirs.cache.length, theirs.cache.commits)
        for a, b in zip(mine.cache.tensors(), theirs.cache.tensors(), strict=True):
            torch.testing.assert_close(a, b, rtol=state[0], atol=state[1])
    return got


def _counting(model: CloverModel, names: Sequence[str]) -> dict[str, list[tuple[int, ...]]]:
    """Wrap the model's ``names`` operators to record the shape of their first input per call."""
    calls: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
    ops = model.ops

    def counted(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            first = args[0]
            assert isinstance(first, torch.Tensor)
            calls[name].append(tuple(first.shape))
            return fn(*args, **kwargs)

        return run

    replaced = dataclasses.replace(ops, **{name: counted(name, getattr(ops, name)) for name in names})
    model._ops[model.device] = replaced
    return calls


@pytest.mark.parametrize("bidirectional", [False, True])
def test_mixed_segments_equal_their_own_forwards(checkpoints: dict[bool, Path], bidirectional: bool) -> None:
    model = _model(checkpoints[bidirectional], torch.float64)
    segments = _segments(model, MIXED, seed=1)
    got = _assert_same(model, segments, LOGITS, STATE)
    assert [g.shape[0] for g in got] == [0, 32, 32, 32, 0, 0, 32, 32, 32, 2, 1, 1]


def test_segments_of_one_shape_share_each_operator_call(checkpoints: dict[bool, Path]) -> None:
    """Not a loop of forwards: the MoE and the GDN core run once per layer over everything."""
    model = _model(checkpoints[True], torch.float64)
    segments = _segments(
        model, [Case(32 * i, 32) for i in range(4)] + [Case(32, 32, commit=True)] * 2, seed=2
    )
    calls = _counting(model, ["sparse_moe", "gated_delta_net", "attention"])
    model.forward_packed(segments)
    config = model.config
    layers, gdn_layers = len(model.layers), config.layer_types.count("linear_attention")
    assert calls["sparse_moe"] == [(6 * 32, config.hidden_size)] * layers  # every request's tokens at once
    # two shapes (denoise, commit): four requests folded into the key heads of one call, then two
    heads, dim = config.linear_num_key_heads, config.linear_key_head_dim
    assert calls["gated_delta_net"] == [(32, 4 * heads, dim), (32, 2 * heads, dim)] * gdn_layers
    assert len(calls["attention"]) == 6 * (layers - gdn_layers)  # attention stays per request


def test_quantised_experts(checkpoints: dict[bool, Path]) -> None:
    """INT4 experts: the packed MoE dequantises the union of every request's experts."""
    model = _model(checkpoints[False], torch.float32, experts="int4")
    segments = _segments(model, MIXED[:4] + MIXED[6:10], seed=3)
    # float32 throughout: logits ~100 agree to ~1e-5 relative; states O(1) to ~1e-6
    _assert_same(model, segments, (1e-4, 1e-2), (1e-4, 1e-4))


def test_triton_kernels_in_the_interpreter(tmp_path: Path) -> None:
    """The Triton operators take folded requests too (float32, interpreted: blocks of 8 tokens, two
    layers; the caches are filled by the PyTorch model)."""
    path = write_tiny_checkpoint(
        tmp_path / "tiny",
        peaked=True,
        seed=3,
        bidirectional=True,
        tokenizer=False,
        overrides={
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "block_size": 8,
        },
    )
    model = _model(path, torch.float32, kernels="triton")
    assert model.ops.backend == "triton"
    cases = [Case(8, 8), Case(0, 8), Case(16, 8, commit=True, logit_rows=0), Case(3, 2, attention="causal")]
    segments = _segments(_model(path, torch.float32), cases, seed=4)
    # float32 kernels, logits ~100: 1e-5 relative seen between the two orders; margin 10x
    _assert_same(model, segments, (1e-4, 1e-2), (1e-4, 1e-4))


def test_bad_segments_are_refused_before_anything_runs(checkpoints: dict[bool, Path]) -> None:
    model = _model(checkpoints[False], torch.float64)
    good, other = _segments(model, [Case(32, 32, commit=True), Case(32, 32)], seed=5)
    with pytest.raises(ValueError, match="its own cache"):
        model.forward_packed([good, dataclasses.replace(other, cache=good.cache)])
    before = [t.clone() for t in good.cache.tensors()]
    bad = dataclasses.replace(other, attention="block", causal_prefix=16)
    with pytest.raises(ValueError, match="causal_prefix must be whole blocks"):
        model.forward_packed([good, bad])
    assert good.cache.length == 32
    for a, b in zip(before, good.cache.tensors(), strict=True):
        assert torch.equal(a, b)  # exact: a refused call touched no state
    assert model.forward_packed([]) == []


def _decode(
    model: CloverModel,
    prompts: Sequence[list[int]],
    blocks: int,
    forward_many: Callable[[list[Segment]], list[torch.Tensor]],
) -> list[list[int]]:
    """Greedy LowConfidence block decoding of every prompt (whole blocks) at once, each request at
    its own pace: every step runs each unfinished request's next pass (a denoising pass of its
    block, or the block's commit fused with nothing) through ``forward_many``."""
    size, mask = model.config.block_size, model.config.mask_token_id
    assert mask is not None
    caches: list[ModelCache] = []
    for prompt in prompts:
        cache = model.new_cache(512)
        model(prompt, cache, attention="block", commit=True, logit_rows=0)
        caches.append(cache)
    out: list[list[int]] = [[] for _ in prompts]
    block: list[list[int]] = [[mask] * size for _ in prompts]
    while True:
        live = [i for i in range(len(prompts)) if len(out[i]) < blocks * size]
        if not live:
            return out
        finished = [i for i in live if mask not in block[i]]
        segments = [
            Segment(
                block[i], caches[i], "block", commit=i in finished, logit_rows=0 if i in finished else None
            )
            for i in live
        ]
        for i, logits in zip(live, forward_many(segments), strict=True):
            if i in finished:
                out[i] += block[i]
                block[i] = [mask] * size
                continue
            probs = torch.softmax(logits.double(), dim=-1)
            probs[:, mask] = 0
            confidence, tokens = probs.max(dim=-1)
            open_ = torch.tensor([t == mask for t in block[i]])
            confidence = confidence.masked_fill(~open_, -1.0)
            fill = (confidence > 0.9) & open_
            if not fill.any():
                fill[int(confidence.argmax())] = True
            for j in fill.nonzero().flatten().tolist():
                block[i][j] = int(tokens[j])


def test_requests_decoding_on_packed_forwards_choose_their_own_tokens(checkpoints: dict[bool, Path]) -> None:
    """Five requests with prompts of 1-3 blocks, each at its own pace (one commits while others
    denoise): the same greedy tokens as each decoded on its own forwards."""
    model = _model(checkpoints[True], torch.float64)
    generator = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, VOCAB, (32 * n,), generator=generator).tolist() for n in (1, 3, 2, 1, 2)]
    expected = _decode(model, prompts, 2, lambda segments: _one_by_one(model, segments))
    got = _decode(model, prompts, 2, model.forward_packed)
    assert got == expected  # exact: token ids (peaked logits: no near ties)
    assert len({tuple(tokens) for tokens in got}) == len(prompts)
