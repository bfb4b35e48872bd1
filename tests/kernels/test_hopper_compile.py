"""Every Triton kernel compiles for Hopper (sm_90a) on this machine, GPU or not, at Clover's shapes
and launch configurations, and no kernel of a decoding step spills registers
(kernels/hopper_compile.py does the compiling; it runs in its own process, without the interpreter
this suite sets up when there is no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Any

import pytest

from clover_agent.engine.model.config import full_size_config_json
from clover_agent.kernels.hopper_compile import CONTEXTS, hopper_problem

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("hopper-compile"),  # one worker compiles, once, for every test here
    pytest.mark.skipif(hopper_problem() is not None, reason=f"cannot compile for sm_90a: {hopper_problem()}"),
]

#: The kernels a decoding step launches (``hopper_compile.steps``: the 32-token block and the
#: 64-token commit + denoise step). They run for every block of every answer, each over a few dozen
#: rows, so nothing hides a spill's round trip through local memory: a spill here is a regression.
DECODE = (
    "rms_norm_kernel",  # the layers' norms
    "rms_norm_rotary_kernel",  # the attention's q / k norms and rotary embedding
    "add_rms_norm_kernel",  # the residual add and the post-attention norm
    "gates_kernel",  # the GDN gates
    "gated_norm_kernel",  # the GDN output norm (and the branch mix)
    "short_conv_kernel",  # the GDN short conv
    "recurrent_kernel",  # the gated delta rule, step by step
    "write_kv_kernel",  # the attention step's K/V write
    "attention_split_kernel",  # split-K attention over the cache
    "attention_combine_kernel",
    "route_kernel",  # the MoE: routing, alignment, both grouped GEMMs, the combine
    "align_kernel",
    "gate_up_kernel",
    "down_kernel",
    "combine_kernel",
    "choose_kernel",  # token choice and the LowConfidence fill
    "fill_kernel",
)
#: Launched only for prompt prefill (the chunked gated delta rule): spills are reported, not failed.
PREFILL_ONLY = ("chunk_prepare_kernel", "chunk_scan_kernel")

#: Decoding kernels known to spill, with what ptxas said; strict, so fixing one fails its xfail and
#: the entry must go.
SPILLING: dict[str, str] = {}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    """The compile report, made once (in a process of its own: TRITON_INTERPRET unset, started in a
    folder where the repository's own folders do not shadow installed packages)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="hopper-compile-") as folder:
        done = subprocess.run(
            [sys.executable, "-m", "clover_agent.kernels.hopper_compile", "--json"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if done.returncode not in (0, 1):  # 1: a kernel failed or is compiled by no step (the tests say which)
        raise AssertionError(f"hopper_compile exited {done.returncode}:\n{done.stderr[-6000:]}")
    return json.loads(done.stdout)


def _rows(report: dict[str, Any], kernel: str) -> list[dict[str, Any]]:
    rows = [row for row in report["compiled"] if row["kernel"] == kernel]
    assert rows, f"{kernel} was compiled by no step"
    return rows


def _numbers(row: dict[str, Any]) -> str:
    return (
        f"{row['kernel']} [{row['variant']}] at {', '.join(row['steps'])}: {row['num_warps']} warps, "
        f"{row['registers']} registers, {row['spill_stores']}/{row['spill_loads']} bytes spill "
        f"stores/loads, {row['shared']} bytes shared"
    )


def test_every_kernel_is_compiled_and_named_here(report: dict[str, Any]) -> None:
    """A new kernel fails here until a step launches it (or a launched kernel calls it) and this
    file says whether it is on the decoding path."""
    assert report["target"] == "sm_90a"
    assert report["uncovered"] == []
    assert {row["kernel"] for row in report["compiled"]} == set(DECODE) | set(PREFILL_ONLY)
    assert {row["kernel"] for row in report["compiled"] if row["decode"]} == set(DECODE)


@pytest.mark.parametrize("kernel", DECODE + PREFILL_ONLY)
def test_compiles_for_sm90(report: dict[str, Any], kernel: str) -> None:
    failed = [f"{row['variant']}: {row['error']}" for row in _rows(report, kernel) if not row["ok"]]
    assert not failed, f"{kernel} does not compile for sm_90a:\n" + "\n".join(failed)


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=SPILLING[k]))
        if k in SPILLING
        else k
        for k in DECODE
    ],
)
def test_no_decoding_kernel_spills(report: dict[str, Any], kernel: str) -> None:
    rows = [row for row in _rows(report, kernel) if row["decode"]]
    assert rows and all(row["ok"] for row in rows), f"{kernel} did not compile at a decoding step"
    spilling = [_numbers(row) for row in rows if row["spills"]]
    assert not spilling, "register spills at a decoding step:\n" + "\n".join(spilling)


def test_the_recurrent_gated_delta_rule_waits_on_few_barriers(report: dict[str, Any]) -> None:
    """The decoding steps' GDN scan runs one warp per program (flash-linear-attention's launch
    shape): its reductions over the key dimension are warp shuffles, so a time step waits on at most
    3 block-wide barriers (four warps per program waited on 14; every GDN layer of every pass runs
    32 to 64 such steps one after another)."""
    rows = [row for row in _rows(report, "recurrent_kernel") if row["decode"]]
    assert rows
    for row in rows:
        assert row["num_warps"] == 1 and row["constexprs"]["BLOCK_V"] == 8, _numbers(row)
        assert row["barriers"] is not None and row["barriers"] <= 3, (
            f"{row['barriers']} barriers: {_numbers(row)}"
        )


@pytest.mark.parametrize("kernel", ["gate_up_kernel", "down_kernel"])
def test_prefill_chunks_run_the_expert_gemms_on_hoppers_warpgroup_mma(
    report: dict[str, Any], kernel: str
) -> None:
    """A full prefill chunk (4,096 tokens, 128 pairs an expert) tiles the grouped GEMMs 64 rows high,
    which Hopper runs as warpgroup MMAs (``wgmma.mma_async``), dense and quantised alike; a decoding
    step's 16-row tiles (a pair or two an expert) use ``mma.sync``, where wgmma's 64 rows would be
    mostly padding."""
    rows = _rows(report, kernel)
    chunk = [row for row in rows if row["steps"] == ["prefill 4096"]]
    assert {row["constexprs"]["QUANT"] for row in chunk} == {"none", "fp8", "int4"}
    for row in chunk:
        assert row["constexprs"]["BLOCK_M"] == 64 and row["wgmma"] > 0, _numbers(row)
    for row in (row for row in rows if row["decode"]):
        assert row["constexprs"]["BLOCK_M"] == 16 and row["wgmma"] == 0, _numbers(row)


@pytest.mark.parametrize("kernel", PREFILL_ONLY)
def test_the_chunked_gated_delta_rule_uses_tensor_cores_without_spills(
    report: dict[str, Any], kernel: str
) -> None:
    """Prompt prefill's GDN kernels at the model's bf16 sizes: every matrix product on tensor cores
    with bf16 operands and float32 sums (``PRECISION=bf16``; the PTX holds only bf16 MMA
    instructions, no TF32 ones, nor the exact-float32 FMAs of ``ieee``) and no register spills (with
    exact float32 dots and four warps the scan spilled 14.9/17.7 KB a thread)."""
    for row in _rows(report, kernel):
        assert row["constexprs"]["PRECISION"] == "bf16", _numbers(row)
        assert row["mma"] and all(".bf16.bf16" in mma for mma in row["mma"]), row["mma"]
        assert row["ok"] and not row["spills"], _numbers(row)


@pytest.mark.parametrize("kernel", PREFILL_ONLY)
def test_prefill_spills_are_reported(report: dict[str, Any], kernel: str) -> None:
    """Prefill-only kernels may spill (a chunk is long enough to hide it); the numbers are shown."""
    rows = _rows(report, kernel)
    assert all(row["ok"] and not row["decode"] for row in rows)
    for row in rows:
        if row["spills"]:
            warnings.warn(f"prefill spills: {_numbers(row)}", stacklevel=1)


def test_the_long_context_is_the_configs() -> None:
    """The attention is compiled at the longest context the shipped config allows."""
    assert max(CONTEXTS) == full_size_config_json()["text_config"]["max_position_embeddings"]
