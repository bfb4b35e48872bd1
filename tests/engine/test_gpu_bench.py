"""``bench/gpu_bench.py`` run as on the device machine, but on the CPU with a tiny checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_bench.py"


def run_bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the script with no Clover weights to be found (empty HF cache, no CLOVER_MODEL)."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "CLOVER_MODEL"}
    env["HF_HUB_CACHE"] = str(tmp_path / "hf-cache")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--threads", "1", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return result, out


@pytest.mark.slow
def test_tiny_random_checkpoint_measures_everything(tmp_path: Path) -> None:
    result, out = run_bench(
        tmp_path,
        *("--preset", "tiny", "--time-budget", "60", "--warmup", "1", "--repeats", "2"),
        *("--prompt-lengths", "128,256", "--decode-tokens", "64"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert set(report) >= {"machine", "model", "settings", "prefill", "passes", "decode", "memory", "budget"}
    assert report["skipped"] == []
    assert report["machine"]["device"] == "cpu" and report["machine"]["torch"]
    model = report["model"]
    assert (model["source"], model["preset"], model["dtype"]) == ("random", "tiny", "float32")
    assert model["bytes"] > 4 * model["parameters"] * 0.9 and model["load_s"] > 0 and model["write_s"] > 0
    assert model["shape"]["layers"] == 4 and model["shape"]["block_size"] == 32

    assert [row["tokens"] for row in report["prefill"]] == [128, 256]
    for row in report["prefill"]:
        assert row["repeats"] == 2 and row["tokens_per_s"] == pytest.approx(row["tokens"] / row["median_s"])
    assert [row["context"] for row in report["passes"]] == [128, 2048]
    assert all(row["denoise_ms"] > 0 and row["commit_ms"] > 0 for row in report["passes"])

    decode = report["decode"]
    assert list(decode) == ["diffusion", "self_speculative", "autoregressive"]
    for mode, stats in decode.items():
        assert stats["tokens"] == 64, mode
        assert stats["tokens_per_s"] > 0 and 0 < stats["tokens_per_forward"] <= 32
        assert stats["forwards_per_block"] == pytest.approx(stats["forwards"] / 2)
    # Autoregressive: one forward per token (plus the prompt's prefill forward).
    assert decode["autoregressive"]["forwards"] in (64, 65)
    assert report["memory"]["peak_rss_mib"] > 50
    assert report["budget"]["used_s"] < 60

    assert "<!-- gpu-bench:start -->" in result.stdout and "<!-- gpu-bench:end -->" in result.stdout
    assert "RANDOM checkpoint, preset `tiny`" in result.stdout
    assert "| 2048 |" in result.stdout and "| autoregressive |" in result.stdout


def test_found_weights_are_used_and_a_spent_budget_skips_every_measurement(
    tmp_path: Path, checkpoint: Path
) -> None:
    result, out = run_bench(tmp_path, "--model", str(checkpoint), "--time-budget", "0")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["model"]["source"] == "weights" and report["model"]["path"] == str(checkpoint)
    assert report["prefill"] == [] and report["passes"] == [] and report["decode"] == {}
    skipped = " ".join(report["skipped"])
    for what in (
        "prefill 512",
        "passes at 128",
        "passes at 2048",
        "decode diffusion",
        "decode autoregressive",
    ):
        assert what in skipped
    assert f"Clover weights from {checkpoint}" in result.stdout and "Skipped:" in result.stdout


def test_a_model_folder_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    result, out = run_bench(tmp_path, "--model", str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "no checkpoint there" in result.stderr and "does not exist" in result.stderr
    assert not out.exists()
