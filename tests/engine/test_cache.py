"""Caches: prefill + continuation equals one forward; uncommitted passes leave the state
bit-identical; partial commits; block-causal semantics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clover_agent.engine.engine import Engine
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import CloverModel
from tests.engine.checkpoints import relative_error, save_reference_checkpoint

#: Logits of the same tokens computed in other passes (prefill then the rest, block by block, a
#: partial commit) against one pass: float32 reductions of other lengths and orders, up to 2.8e-6 of
#: the largest logit with AVX2 kernels and 3 threads. A wrong state or mask is off by 1e-2 and more.
LOGITS = 1e-4


def assert_same_state(a: ModelCache, b: ModelCache) -> None:
    assert (a.length, a.commits) == (b.length, b.commits)
    ta, tb = a.tensors(), b.tensors()
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)  # exact: a pass that commits nothing writes nothing


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CloverModel:
    folder = tmp_path_factory.mktemp("ck")
    save_reference_checkpoint(folder, seed=1)
    return Engine.from_pretrained(folder, progress=None).model


def token_ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (length,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("prefix", "total"), [(1, 40), (17, 50), (32, 70), (33, 100), (64, 65)])
def test_causal_prefill_then_rest_equals_one_forward(model: CloverModel, prefix: int, total: int) -> None:
    ids = token_ids(total, seed=prefix)
    full = model(ids, model.new_cache(), attention="causal")
    cache = model.new_cache()
    head = model(ids[:prefix], cache, attention="causal", commit=True)
    assert cache.length == prefix and cache.commits == 1
    tail = model(ids[prefix:], cache, attention="causal")
    assert relative_error(torch.cat([head, tail]), full) <= LOGITS


@pytest.mark.parametrize(("prefix", "total"), [(32, 70), (64, 96), (32, 33)])
def test_block_prefill_then_rest_equals_one_forward(model: CloverModel, prefix: int, total: int) -> None:
    ids = token_ids(total, seed=total)
    full = model(ids, model.new_cache(), attention="block")
    cache = model.new_cache()
    head = model(ids[:prefix], cache, attention="block", commit=True)
    tail = model(ids[prefix:], cache, attention="block")
    assert relative_error(torch.cat([head, tail]), full) <= LOGITS


def test_block_by_block_commits_equal_full_block_recompute(model: CloverModel) -> None:
    ids = token_ids(110, seed=5)
    full = model(ids, model.new_cache(), attention="block")
    cache = model.new_cache()
    pieces = []
    for start in range(0, 110, 32):
        block = ids[start : start + 32]
        pieces.append(model(block, cache, attention="block"))  # a denoise-like pass first
        committed = model(block, cache, attention="block", commit=True)
        assert torch.equal(committed, pieces[-1])  # exact: a full commit runs the same ops, then writes
    assert cache.commits == 4 and cache.length == 110
    assert relative_error(torch.cat(pieces), full) <= LOGITS


def test_block_rule_full_inside_block_causal_across(model: CloverModel) -> None:
    ids = token_ids(64, seed=7)
    changed = ids.clone()
    changed[20] = (ids[20] + 1) % 512  # a later token inside block 0
    base = model(ids, model.new_cache(), attention="block")
    other = model(changed, model.new_cache(), attention="block")
    # earlier positions of the same block see it (unlike causal attention) ...
    # (the changed token moves those logits by O(1): far beyond any tolerance below)
    assert not torch.allclose(base[:20], other[:20], rtol=1e-3, atol=1e-3)
    causal_base = model(ids, model.new_cache(), attention="causal")
    causal_other = model(changed, model.new_cache(), attention="causal")
    # Equal in exact arithmetic; in float32 the rows ride in passes whose other rows differ (the MoE
    # groups tokens by expert, so a GEMM's shape and blocking may change): reordering-level noise.
    torch.testing.assert_close(causal_base[:20], causal_other[:20], rtol=1e-5, atol=1e-5)
    # ... and a change in block 1 never reaches block 0
    changed_later = ids.clone()
    changed_later[40] = (ids[40] + 1) % 512
    later = model(changed_later, model.new_cache(), attention="block")
    torch.testing.assert_close(base[:32], later[:32], rtol=1e-5, atol=1e-5)  # as above
    assert not torch.allclose(base[32:40], later[32:40], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("attention", ["causal", "block"])
def test_uncommitted_forward_leaves_cache_bit_identical(model: CloverModel, attention: str) -> None:
    ids = token_ids(96, seed=11)
    cache = model.new_cache()
    model(ids[:64], cache, attention="block", commit=True)
    before = cache.clone()
    first = model(ids[64:], cache, attention=attention)
    assert_same_state(cache, before)
    again = model(ids[64:], cache, attention=attention)
    assert torch.equal(first, again)  # exact: the same pass on the same state, run twice
    assert_same_state(cache, before)


def test_partial_commit_equals_committing_only_those_tokens(model: CloverModel) -> None:
    ids = token_ids(60, seed=13)
    base = model.new_cache()
    model(ids[:25], base, attention="causal", commit=True)
    partial, exact = base.clone(), base.clone()
    logits_partial = model(ids[25:45], partial, attention="causal", commit=7)
    logits_plain = model(ids[25:45], base.clone(), attention="causal")
    assert relative_error(logits_partial, logits_plain) <= LOGITS
    model(ids[25:32], exact, attention="causal", commit=True)
    assert (partial.length, partial.commits) == (exact.length, exact.commits) == (32, 2)
    for x, y in zip(partial.tensors(), exact.tensors(), strict=True):
        assert x.shape == y.shape
        assert (x - y).abs().max() <= 1e-5 * y.abs().max()  # the scan split at 7: 1.5e-6 seen
    follow_partial = model(ids[32:], partial, attention="causal")
    follow_exact = model(ids[32:], exact, attention="causal")
    assert relative_error(follow_partial, follow_exact) <= LOGITS


def test_clone_is_independent_and_nbytes_counts_state(model: CloverModel) -> None:
    cache = model.new_cache()
    empty_bytes = cache.nbytes()
    assert empty_bytes > 0  # GDN states exist before any token
    model(token_ids(10), cache, attention="causal", commit=True)
    copy = cache.clone()
    model(token_ids(5, seed=2), cache, attention="causal", commit=True)
    assert copy.length == 10 and cache.length == 15 and cache.commits == 2
    assert cache.nbytes() > empty_bytes
    # exact: the clone kept the old state while the cache moved on (a difference test)
    assert any(not torch.equal(a, b) for a, b in zip(copy.tensors(), cache.tensors(), strict=True))


def test_bad_forward_arguments_are_rejected(model: CloverModel) -> None:
    cache = model.new_cache()
    model(token_ids(5), cache, attention="causal", commit=True)
    with pytest.raises(ValueError, match="block boundary"):
        model(token_ids(4), cache, attention="block")
    fresh = model.new_cache()
    with pytest.raises(ValueError, match="partial commit"):
        model(token_ids(8), fresh, attention="block", commit=3)
    for bad in (0, 9, -1):
        with pytest.raises(ValueError, match="commit"):
            model(token_ids(8), fresh, attention="causal", commit=bad)
    with pytest.raises(ValueError, match="attention"):
        model(token_ids(8), fresh, attention="bidirectional")  # type: ignore[arg-type]
    assert fresh.length == 0 and fresh.commits == 0


def test_cache_empty_shapes(tmp_path: Path, model: CloverModel) -> None:
    cfg = model.config
    cache = ModelCache.empty(cfg, "cpu", torch.float32)
    gdn = cache.layers[cfg.layer_types.index("linear_attention")]
    assert gdn.recurrent.shape == (
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )
    assert gdn.recurrent.dtype == torch.float32
    assert gdn.conv.shape == (cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
