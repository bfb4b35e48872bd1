"""``clover-agent eval bench/tasks --gold`` in the default Docker sandbox on the three fastest
shipped tasks (pinned sdists from the package index): every task resolved, and fix's verdict
agrees with the grade on each. The whole set's runs are in bench/RESULTS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FASTEST = (
    "parse-1.20.1-subsecond-format",
    "pathspec-0.12.1-match-file-none",
    "markupsafe-2.1.5-striptags-spaces",
)


def test_gold_resolves_the_ci_subset_with_no_disagreement(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "clover_agent", "eval", str(ROOT / "bench" / "tasks"), "--output-dir", str(out),
         "--gold", "--only", *FASTEST],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    summary = json.loads((out / "report.json").read_text())
    assert summary["resolved"] == 3 and summary["resolved_rate"] == 1
    assert summary["disagreements"] == [] and summary["errors"] == []
    assert {r["verdict"] for r in summary["results"]} == {"fixed"}
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["instance_id"] for line in lines) == sorted(FASTEST)
