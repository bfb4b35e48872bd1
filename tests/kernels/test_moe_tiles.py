"""The grouped expert GEMMs' tile shapes: the heuristic, tuned tables (written by the tuner, read
back by the launcher), and the same results under any tiles."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from clover_agent.kernels import moe
from clover_agent.kernels.bench import CLOVER
from clover_agent.kernels.moe import reference
from clover_agent.kernels.moe.tiles import (
    TABLE_VARIABLE,
    Tiles,
    device_table_name,
    problem_key,
    tiles_for,
    write_table,
)
from tests.kernels.helpers import DEVICE, requires_triton

TINY = dataclasses.replace(CLOVER, experts=4, hidden=32, moe_inner=16, top_k=2)
SHAPE = {"experts": 256, "hidden": 2048, "inner": 512, "top_k": 8, "dtype": torch.bfloat16, "quant": "none"}


def test_without_a_table_the_heuristic_tiles_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TABLE_VARIABLE, raising=False)
    cpu = torch.device("cpu")
    assert tiles_for(32, device=cpu, **SHAPE) == Tiles(16)  # one or two pairs an expert: 16 rows
    assert tiles_for(1024, device=cpu, **SHAPE) == Tiles(32)  # 32 pairs an expert
    assert tiles_for(4096, device=cpu, **SHAPE) == Tiles(64)  # 128: Hopper's wgmma height
    assert tiles_for(4096, device=cpu, scale_k=32, **SHAPE).block_k == 32  # whole scale blocks a step
    assert device_table_name(cpu) == "cpu.json"


def test_a_table_is_read_at_the_nearest_measured_token_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "gpu.json"
    key = problem_key(**SHAPE)
    write_table(table, "Some GPU", {key: {32: Tiles(16, 128, 64, 4, 4), 4096: Tiles(128, 128, 64, 8, 3)}}, {})
    write_table(table, "Some GPU", {key: {1024: Tiles(64, 64, 128, 4, 3)}}, {})  # merged in
    monkeypatch.setenv(TABLE_VARIABLE, str(table))
    cpu = torch.device("cpu")
    assert tiles_for(64, device=cpu, **SHAPE) == Tiles(16, 128, 64, 4, 4)
    assert tiles_for(900, device=cpu, **SHAPE) == Tiles(64, 64, 128, 4, 3)
    assert tiles_for(3000, device=cpu, **SHAPE) == Tiles(128, 128, 64, 8, 3)
    # K steps of 128 inputs, but the FP8 scales cover 128: kept; INT4 groups of 64: cut to 64
    assert tiles_for(1024, device=cpu, scale_k=64, **SHAPE).block_k == 64
    other = {**SHAPE, "quant": "fp8"}
    assert tiles_for(1024, device=cpu, **other) == Tiles(32)  # no entry for that problem: heuristic


def test_a_bad_table_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"problems": {problem_key(**SHAPE): {"32": {"block_m": 24}}}}))
    monkeypatch.setenv(TABLE_VARIABLE, str(bad))
    with pytest.raises(ValueError, match=r"bad\.json cannot be read: block_m must be a power of two"):
        tiles_for(32, device=cpu, **SHAPE)
    monkeypatch.setenv(TABLE_VARIABLE, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"names .*missing\.json, which is not a file"):
        tiles_for(32, device=cpu, **SHAPE)


@requires_triton
def test_the_engine_names_a_bad_table_when_it_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read when the model loads with the Triton MoE, not at its first launch mid-answer."""
    from clover_agent.engine.engine import Engine
    from clover_agent.engine.loading.tiny import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", seed=1)
    monkeypatch.setenv(TABLE_VARIABLE, str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match=r"names .*absent\.json, which is not a file"):
        Engine.from_pretrained(checkpoint, kernels={"sparse_moe": "triton"}, progress=None)
    assert Engine.from_pretrained(checkpoint, kernels="torch", progress=None)  # the PyTorch MoE reads none


@requires_triton
def test_tuning_writes_a_table_the_launcher_then_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tuner on tiny sizes in the interpreter (its times mean nothing here: the mechanism is
    what is checked): every candidate agrees with the heuristic tiles, one is kept per token count,
    and with the table named the MoE runs those tiles and still matches the reference."""
    from clover_agent.kernels.moe.tune import tune

    monkeypatch.delenv(TABLE_VARIABLE, raising=False)
    space = [Tiles(16, 16, 16), Tiles(32, 32, 16)]
    problems, rows = tune(
        sizes=TINY, tokens=(3, 40), quants=("none",), dtype=torch.float32, device=DEVICE,
        space=lambda tokens: space, repeats=1,
    )  # fmt: skip
    key = problem_key(4, 32, 16, 2, torch.float32, "none")
    assert set(problems) == {key} and set(problems[key]) == {3, 40}
    assert all(tiles in space for tiles in problems[key].values())
    for row in rows:
        assert row["dropped"] == {} and row["candidates"] == 2 and row["best_ms"] > 0, row
    table = tmp_path / "tuned.json"
    write_table(table, "interpreter", problems, {"space": "test"})
    monkeypatch.setenv(TABLE_VARIABLE, str(table))
    assert tiles_for(40, device=torch.device(DEVICE), **{**SHAPE, **dict(experts=4, hidden=32, inner=16, top_k=2, dtype=torch.float32)}) == problems[key][40]  # fmt: skip

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 32, generator=gen).to(DEVICE)
    logits = torch.randn(40, 4, generator=gen).to(DEVICE)
    gate_up = (torch.randn(4, 32, 32, generator=gen) * 32**-0.5).to(DEVICE)
    down = (torch.randn(4, 32, 16, generator=gen) * 16**-0.5).to(DEVICE)
    from clover_agent.kernels.moe import fused_moe

    heights: list[int] = []
    align = fused_moe.align_pairs

    def recording(ids: torch.Tensor, experts: int, block_m: int):  # type: ignore[no-untyped-def]
        heights.append(block_m)  # the tile height the launch uses; the real alignment runs
        return align(ids, experts, block_m)

    monkeypatch.setattr(fused_moe, "align_pairs", recording)
    got = moe.sparse_moe(x, logits, 2, gate_up, down)
    assert heights == [problems[key][40].block_m]
    want = reference.sparse_moe(x, logits, 2, gate_up, down)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32, other sum orders only
