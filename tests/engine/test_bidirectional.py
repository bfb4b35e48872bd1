"""The bidirectional GDN extension against a float64 loop written from the layout's document
(docs/bidirectional-gdn.md, steps 2-5, plus step 6), and inside the whole model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from clover_agent.engine.engine import Engine
from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.model.cache import GdnState, ModelCache
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.forward import ForwardContext
from clover_agent.engine.model.gdn import GatedDeltaNet
from clover_agent.engine.ops import resolve_ops
from tests.engine.checkpoints import (
    add_bidirectional_tensors,
    convert_checkpoint,
    read_tensors,
    relative_error,
    save_reference_checkpoint,
    tiny_text_config,
    write_tensors,
)


def context(steps: int, block_size: int, block_from: int | None, commit: int) -> ForwardContext:
    """What the model hands a layer for ``steps`` tokens at the start of a sequence."""
    empty = torch.empty(steps, 0)
    return ForwardContext(
        ops=resolve_ops("torch"),
        past=0,
        steps=steps,
        block_size=block_size,
        block_from=block_from,
        commit=commit,
        positions=torch.arange(steps),
        rotary=(empty, empty),
    )


def reference_layer(
    layer: GatedDeltaNet, x: torch.Tensor, state: GdnState, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Literal float64 loop over positions: (layer output, committed recurrent state, conv tail).

    ``x`` starts on a block boundary; blocks are [0, B), [B, 2B), ... of the given tokens."""
    cfg = layer.config
    p = {name: t.detach().double() for name, t in layer.named_parameters()}
    x = x.double()
    steps = x.shape[0]
    kernel, right_kernel = cfg.linear_conv_kernel_dim, cfg.right_conv_kernel_size
    conv_w = p["conv1d.weight"][:, 0, :]  # [C, K]
    right_w = p["bidirectional.conv1d_right.weight"][:, 0, :]  # [C, K_r]
    # 1. u = in_proj_qkv(h)
    u = x @ p["in_proj_qkv.weight"].t()
    history = state.conv.double()  # [C, K-1], the rows before x

    def row(i: int) -> torch.Tensor:
        return u[i] if i >= 0 else history[:, kernel - 1 + i]

    # 2. pre = causal_conv(u; conv state) + right_conv_blocklocal(u); SiLU; split; L2-normalise q, k
    pre = torch.zeros_like(u)
    for t in range(steps):
        block_end = min((t // block_size + 1) * block_size, steps)
        for j in range(kernel):  # tap K-1 is the current row
            pre[t] += conv_w[:, j] * row(t - (kernel - 1) + j)
        for j in range(right_kernel):  # taps x[t+1 ... t+K_r], zero past the block end
            if t + 1 + j < block_end:
                pre[t] += right_w[:, j] * u[t + 1 + j]
    act = F.silu(pre)
    key_dim, hk, hv = cfg.linear_key_dim, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    q = act[:, :key_dim].reshape(steps, hk, dk)
    k = act[:, key_dim : 2 * key_dim].reshape(steps, hk, dk)
    v = act[:, 2 * key_dim :].reshape(steps, hv, dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(x @ p["in_proj_b.weight"].t())
    g = -torch.exp(p["A_log"]) * F.softplus(x @ p["in_proj_a.weight"].t() + p["dt_bias"])
    scale = dk**-0.5
    group = hv // hk

    def step(s: torch.Tensor, t: int, h: int) -> torch.Tensor:
        kt = k[t, h // group]
        s = torch.exp(g[t, h]) * s
        s = s + torch.outer(kt, beta[t, h] * (v[t, h] - s.t() @ kt))
        return s

    # 3. forward branch: left to right from the committed state S
    o_f = torch.zeros(steps, hv, dv, dtype=torch.float64)
    final = torch.zeros(hv, dk, dv, dtype=torch.float64)
    for h in range(hv):
        s = state.recurrent[h].double()
        for t in range(steps):
            s = step(s, t, h)
            o_f[t, h] = scale * s.t() @ q[t, h // group]
        final[h] = s
    # 4. backward branch: right to left inside each block from zero, position t included
    o_b = torch.zeros(steps, hv, dv, dtype=torch.float64)
    for start in range(0, steps, block_size):
        for h in range(hv):
            s = torch.zeros(dk, dv, dtype=torch.float64)
            for t in reversed(range(start, min(start + block_size, steps))):
                s = step(s, t, h)
                o_b[t, h] = scale * s.t() @ q[t, h // group]
    # 5. per-head softmax mix
    w = torch.softmax(p["bidirectional.bidir_mix_logits"], dim=-1)
    o = w[None, :, 0, None] * o_f + w[None, :, 1, None] * o_b
    # 6. out = out_proj(gated_rmsnorm(o, z))
    z = (x @ p["in_proj_z.weight"].t()).reshape(steps, hv, dv)
    normed = o / torch.sqrt((o * o).mean(-1, keepdim=True) + cfg.rms_norm_eps) * p["norm.weight"] * F.silu(z)
    out = normed.reshape(steps, -1) @ p["out_proj.weight"].t()
    all_rows = torch.cat([history, u.t()], dim=1)
    return out, final, all_rows[:, -(kernel - 1) :]


def bidirectional_layer(block_size: int, right_kernel: int, seed: int) -> GatedDeltaNet:
    data = {"model_type": "qwen3_5_moe_text", **tiny_text_config()}
    data.update(bidirectional_gdn=True, block_size=block_size, right_conv_kernel_size=right_kernel)
    layer = GatedDeltaNet(CloverConfig.from_dict(data))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=generator) * 2 - 1)
    return layer


@pytest.mark.parametrize(
    ("steps", "block_size", "right_kernel"), [(21, 8, 3), (32, 32, 4), (7, 8, 4), (40, 16, 5)]
)
def test_module_matches_float64_loop_from_the_document(
    steps: int, block_size: int, right_kernel: int
) -> None:
    layer = bidirectional_layer(block_size, right_kernel, seed=steps)
    cfg = layer.config
    generator = torch.Generator().manual_seed(100 + steps)
    x = torch.randn(steps, cfg.hidden_size, generator=generator)
    state = GdnState(
        recurrent=torch.randn(
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            generator=generator,
        ),
        conv=torch.randn(cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, generator=generator),
    )
    expected_out, expected_state, expected_conv = reference_layer(layer, x, state, block_size)
    with torch.no_grad():
        probe = copy.deepcopy(state)
        out = layer(x, probe, context(steps, block_size, 0, 0))
        # exact: a pass that commits nothing leaves the state untouched
        assert torch.equal(probe.recurrent, state.recurrent) and torch.equal(probe.conv, state.conv)
        committed = layer(x, probe, context(steps, block_size, 0, steps))
    assert torch.equal(out, committed)  # exact: a full commit runs the same ops, then writes the state
    assert relative_error(out, expected_out) <= 1e-5
    # only the forward branch and the causal conv tail enter the committed state
    assert relative_error(probe.recurrent, expected_state) <= 1e-5
    # float32 projection rows against the float64 loop's: 3.4e-7 seen with AVX2 kernels, so 1e-5
    assert relative_error(probe.conv, expected_conv) <= 1e-5


def test_without_block_mode_the_layer_is_causal() -> None:
    layer = bidirectional_layer(8, 4, seed=1)
    cfg = layer.config
    x = torch.randn(20, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    state = ModelCache.empty(cfg, "cpu", torch.float32).layers[0]
    with torch.no_grad():
        causal = layer(x, copy.deepcopy(state), context(20, 8, None, 0))
        prefix = layer(x[:10], copy.deepcopy(state), context(10, 8, None, 0))
        block = layer(x, copy.deepcopy(state), context(20, 8, 0, 0))
    assert relative_error(causal[:10], prefix) <= 1e-6
    # the backward branch moves the output by O(0.1), far beyond float32 noise
    assert not torch.allclose(causal, block, rtol=1e-3, atol=1e-3)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.nn.Module]:
    plain = tmp_path_factory.mktemp("plain")
    model = save_reference_checkpoint(plain, seed=4)
    bidirectional = convert_checkpoint(plain, tmp_path_factory.mktemp("bidir"), layout="fused", shards=2)
    add_bidirectional_tensors(bidirectional, seed=4)
    return plain, bidirectional, model


def test_model_with_bidirectional_tensors_block_by_block_equals_full_recompute(
    checkpoints: tuple[Path, Path, torch.nn.Module],
) -> None:
    _, folder, _ = checkpoints
    engine = Engine.from_pretrained(folder, progress=None)
    model = engine.model
    assert engine.config.bidirectional_gdn
    ids = torch.randint(0, 512, (90,), generator=torch.Generator().manual_seed(9))
    full = model(ids, model.new_cache(), attention="block")
    cache = model.new_cache()
    pieces = []
    for start in range(0, 90, 32):
        block = ids[start : start + 32]
        before = cache.clone()
        pieces.append(model(block, cache, attention="block"))
        for a, b in zip(cache.tensors(), before.tensors(), strict=True):
            assert torch.equal(a, b)  # exact: an uncommitted pass leaves the cache untouched
        model(block, cache, attention="block", commit=True)
    # Block by block against one pass: the scans and attention reduce over other lengths; 5.4e-6 of
    # the largest logit seen with AVX2 kernels and 3 threads. A wrong state handoff is off by 1e-2.
    assert relative_error(torch.cat(pieces), full) <= 1e-4
    # prefill of whole blocks, then the rest
    cache = model.new_cache()
    head = model(ids[:64], cache, attention="block", commit=True)
    tail = model(ids[64:], cache, attention="block")
    assert relative_error(torch.cat([head, tail]), full) <= 1e-4  # as above (4.1e-6 seen)


def test_bidirectional_branch_changes_block_mode_only(
    checkpoints: tuple[Path, Path, torch.nn.Module],
) -> None:
    plain_dir, bidir_dir, reference = checkpoints
    plain = Engine.from_pretrained(plain_dir, progress=None).model
    bidir = Engine.from_pretrained(bidir_dir, progress=None).model
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3))
    # causal mode ignores the extra tensors: still exactly transformers' causal model
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    assert relative_error(bidir(ids, bidir.new_cache(), attention="causal"), expected) <= 1e-4
    block_plain = plain(ids, plain.new_cache(), attention="block")
    block_bidir = bidir(ids, bidir.new_cache(), attention="block")
    assert relative_error(block_bidir, block_plain) > 1e-3


def test_tensors_without_flag_enable_the_branch(
    tmp_path: Path, checkpoints: tuple[Path, Path, torch.nn.Module]
) -> None:
    plain_dir, _, _ = checkpoints
    folder = convert_checkpoint(plain_dir, tmp_path / "noflag")
    add_bidirectional_tensors(folder, seed=5, kernel=3, flag=False)
    engine = Engine.from_pretrained(folder, progress=None)
    assert engine.config.bidirectional_gdn and engine.config.right_conv_kernel_size == 3


def test_flag_without_tensors_is_an_error(
    tmp_path: Path, checkpoints: tuple[Path, Path, torch.nn.Module]
) -> None:
    plain_dir, _, _ = checkpoints
    folder = convert_checkpoint(plain_dir, tmp_path / "flagonly")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "bidirectional_gdn": True}))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.linear_attn\.conv1d_right\.weight"):
        Engine.from_pretrained(folder, progress=None)


def test_extra_tensors_outside_the_layout_are_listed(
    tmp_path: Path, checkpoints: tuple[Path, Path, torch.nn.Module]
) -> None:
    _, bidir_dir, _ = checkpoints
    tensors = read_tensors(bidir_dir)
    tensors["model.layers.0.linear_attn.conv1d_left.weight"] = torch.zeros(128, 1, 4)
    tensors["model.layers.2.linear_attn.bidir_gate"] = torch.zeros(4)
    folder = tmp_path / "extra"
    write_tensors(folder, tensors)
    (folder / "config.json").write_text((bidir_dir / "config.json").read_text())
    with pytest.raises(CheckpointError) as error:
        Engine.from_pretrained(folder, progress=None)
    assert "model.layers.0.linear_attn.conv1d_left.weight" in str(error.value)
    assert "model.layers.2.linear_attn.bidir_gate" in str(error.value)
