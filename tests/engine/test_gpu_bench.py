"""``bench/gpu_bench.py`` end to end on the CPU at tiny shapes, run as on the device machine: from a
copy of the working tree that is not the installed one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["denoise_32", "commit_32", "fused_64", "verify_64", "ar_1"]
#: The tiny shape's expert width (engine/loading/tiny.py's TINY_TEXT_CONFIG).
TINY_MOE_INTERMEDIATE = 32


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree's files as the device machine receives them (no .git, no .venv)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    copy = tmp_path_factory.mktemp("device") / "repo"
    for name in listed:
        source = ROOT / name
        if source.is_symlink():  # clover_agent/<name> -> ../<name>, as a git checkout makes them
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(source), copy / name)
        elif source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def run_bench(tree: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CLOVER_MODEL"}
    env["HF_HUB_CACHE"] = str(out.parent / "hf-cache")
    script = str(tree / "bench" / "gpu_bench.py")
    return subprocess.run(
        [sys.executable, script, "--device", "cpu", "--threads", "1", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_tiny_shape_measures_every_piece_from_a_copy_of_the_tree(tree_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(
        tree_copy,
        out,
        *(
            "--shape",
            "tiny",
            "--context",
            "256",
            "--time-budget",
            "200",
            "--repeats",
            "1",
            "--decode-tokens",
            "40",
            "--prefill-tokens",
            "256",
            "--agent-prompt-tokens",
            "200",
            "--agent-new-tokens",
            "48",
            "--batch-sizes",
            "1,4,16",
            "--commit",
            "0123abc",
        ),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(out.read_text())
    assert report["errors"] == [] and report["skipped"] == []
    # It ran the copy's engine, not the installed one.
    assert report["machine"]["source"] == str(tree_copy / "engine")
    assert report["copy_bandwidth"]["gb_per_s"] > 0
    assert report["machine"]["commit"] == "0123abc"  # as given: the copy has no .git

    # Every kernel against its reference (the interpreter here: TRITON_INTERPRET=1 from conftest).
    kernels = {row["name"].split("[")[0] for row in report["kernels"]["rows"]}
    assert kernels == {"moe", "short_conv", "gated_delta_net", "attention", "low_confidence"}
    for row in report["kernels"]["rows"]:
        assert "error" not in row and row["median_ms"] > 0 and row["gb_per_s"] > 0, row["name"]
        assert row["within_bound"] is not False, row["name"]  # None: a sampled draw has no exact reference
        # The PyTorch reference timed beside the kernel in the same run.
        assert row["reference_ms"] > 0 and row["speedup"] > 0, row["name"]

    model = report["model"]
    assert model["source"] == "random" and model["dtype"] == "float32"
    assert model["shape"] == {
        "layers": 4,
        "hidden_size": 64,
        "experts": 8,
        "experts_per_token": 2,
        "vocab_size": 248320,  # the real vocabulary's size, no tokenizer needed
        "block_size": 32,
    }
    assert set(model["operators"].values()) == {"torch"}

    steps = report["steps"]
    assert list(steps) == STEPS
    for name, row in steps.items():
        assert row["median_ms"] > 0 and row["floor_ms"] > 0 and row["over_floor"] > 0, name
        assert 0 < row["bytes"]["experts_per_layer"] <= 8 and row["operators"] > 100, name
        assert "graph_ms" not in row  # CUDA only
    assert steps["commit_32"]["bytes"]["lm_head"] == 0 < steps["denoise_32"]["bytes"]["lm_head"]
    assert steps["ar_1"]["bytes"]["experts_per_layer"] <= 2  # one token routes to top-2

    rates = report["mode_rates"]
    assert [row["tokens_per_forward"] for row in rates] == [1.0, 2.0, 3.0, 4.0, 6.0]
    assert all(row["diffusion_fused"] > 0 and row["autoregressive"] > 0 for row in rates)
    assert "random weights measure none" in report["tokens_per_forward_source"]
    assert set(report["decode"]) == {"diffusion", "self_speculative", "autoregressive"}
    assert all(row["tokens"] == 40 and row["ms_per_forward"] > 0 for row in report["decode"].values())
    assert report["budget"]["used_s"] < 200

    # Batching (issue 40): packed steps of 1-16 requests' passes, each beside the same passes one by
    # one and one request's pass over as many tokens; then N calls through BatchEngine, packed.
    batched = report["batched_steps"]
    assert [row["requests"] for row in batched["rows"]] == [1, 4, 16] and batched["one_ms"] > 0
    for row in batched["rows"]:
        assert row["packed_ms"] > 0 and row["one_by_one_ms"] > 0 and row["floor_ms"] > 0, row
        assert row["passes_per_s"] == pytest.approx(row["requests"] / row["packed_ms"] * 1e3, rel=1e-9)
    engine_rows = {row["requests"]: row for row in report["batch_engine"]["rows"]}
    assert set(engine_rows) == {1, 8}
    assert engine_rows[1]["tokens"] == 16 and engine_rows[8]["tokens"] == 8 * 16  # the stop token ignored
    assert engine_rows[1]["forwards_per_step"] == 1.0 < engine_rows[8]["forwards_per_step"] <= 8.0
    assert engine_rows[1]["vs_one"] == 1.0 and engine_rows[8]["vs_one"] > 0

    # Prefill throughput, the model's operators beside the PyTorch ones, and the agent's two turns:
    # the second re-sends the first's prompt and answer, and reuses their committed state.
    prefill = report["prefill"]
    assert prefill["tokens"] == 256 and prefill["model"]["tokens_per_s"] > 0
    assert prefill["torch_reference"]["operators"] == "torch" and prefill["speedup"] > 0
    agent = report["agent_path"]
    first, second = agent["first_turn"], agent["second_turn"]
    assert agent["cuda_graphs"] is False  # CUDA only
    assert (first["prompt_tokens"], first["tokens"], first["reused_tokens"]) == (200, 48, 0)
    assert first["first_block_s"] > 0 and first["decode_tokens_per_s"] > 0
    assert second["prompt_tokens"] == 200 + 48 + 40
    assert second["reused_tokens"] > 200 // 32 * 32  # past the first prompt: the answer's state too
    # graphs (rehearsed here) against eager: the same tokens; the steps replayed, but no pass with
    # its token choice: on the CPU "auto" chooses tokens with PyTorch, not the fused step
    versus = agent["graphs_vs_eager"]
    assert versus["rehearsed"] and versus["same"] and versus["tokens"] == 128, versus
    assert versus["replays"] > 0 and versus["pass_replays"] == 0

    # The same steps on the routed experts quantised in place, FP8 then INT4 (from the FP8 ones).
    dense_experts = (
        steps["denoise_32"]["bytes"]["routed_experts"] / steps["denoise_32"]["bytes"]["experts_per_layer"]
    )
    for scheme, bytes_per_weight in (("fp8", 1), ("int4", 0.5)):
        made = report[f"experts_{scheme}"]
        weights = 4 * 8 * 3 * 64 * TINY_MOE_INTERMEDIATE  # layers x experts x three matrices
        assert weights * bytes_per_weight < made["routed_experts_bytes"] < weights * bytes_per_weight * 1.2
        quantized = report[f"steps_{scheme}"]
        assert list(quantized) == STEPS
        for name, row in quantized.items():
            assert row["median_ms"] > 0 and row["floor_ms"] > 0, (scheme, name)
            per_expert = row["bytes"]["routed_experts"] / row["bytes"]["experts_per_layer"]
            assert per_expert < dense_experts / 3, (scheme, name)  # float32 here: 4 bytes a weight
        assert [row["tokens_per_forward"] for row in report[f"mode_rates_{scheme}"]] == [
            1.0,
            2.0,
            3.0,
            4.0,
            6.0,
        ]

    text = result.stdout
    assert "Routed experts as FP8" in text and "Routed experts as INT4" in text
    assert text.startswith("<!-- gpu-bench:start -->") and "<!-- gpu-bench:end -->" in text
    assert "RANDOM weights built on the device" in text and "| fused_64 |" in text
    assert "| PyTorch reference | torch |" in text and "| second turn | 288 |" in text
    assert "Batched steps (issue 40)" in text and "| 16 |" in text and "BatchEngine: N concurrent" in text
    assert "| kernel | shape | rel. error (bound) | median µs" in text and "| speed-up |" in text
    assert f"full results: {out}" in result.stderr


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_a_real_checkpoint_gives_measured_tokens_per_forward(
    checkpoint: Path, tree_copy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(
        tree_copy,
        out,
        *("--model", str(checkpoint), "--context", "64", "--repeats", "1", "--decode-tokens", "32"),
        *("--tokens-per-forward", "2", "--time-budget", "200"),
    )
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(out.read_text())
    assert report["model"]["source"] == "weights" and report["model"]["path"] == str(checkpoint)
    measured = report["decode"]["diffusion"]["tokens_per_forward"]
    assert report["mode_rates"][0]["tokens_per_forward"] == round(measured, 2)
    assert report["tokens_per_forward_source"].startswith("measured")
    assert f"weights from {checkpoint}" in result.stdout


def test_a_spent_budget_names_every_skipped_piece(tree_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(tree_copy, out, "--time-budget", "0")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert "kernels" not in report and "steps" not in report and "decode" not in report
    skipped = " ".join(report["skipped"])
    for piece in ("copy bandwidth", "kernels", "model"):
        assert f"{piece}: skipped" in skipped
    assert "Skipped:" in result.stdout


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_missing_pieces_are_reported_not_crashes(tree_copy: Path, tmp_path: Path) -> None:
    """A checkpoint that is not there, and a shape that does not fit this machine: each a clear
    error in the report (exit status 1), the rest of the run done."""
    out = tmp_path / "bench.json"
    result = run_bench(tree_copy, out, "--model", str(tmp_path / "missing"), "--time-budget", "60")
    assert result.returncode == 1
    report = json.loads(out.read_text())
    assert any("no checkpoint there" in e and "does not exist" in e for e in report["errors"])
    assert "copy_bandwidth" in report and "Traceback" not in result.stderr
    assert "Errors: model: FileNotFoundError" in result.stdout

    huge = tmp_path / "huge.json"
    limited = ("--shape", "full", "--memory-limit-gb", "2", "--time-budget", "60", "--repeats", "1")
    result = run_bench(tree_copy, huge, *limited)
    report = json.loads(huge.read_text())
    assert result.returncode == 1 and "steps" not in report and "kernels" not in report
    errors = " | ".join(report["errors"])
    assert "kernels: MemoryError: the kernel inputs would take about" in errors
    assert "model: MemoryError: the 40-layer model would take about" in errors
