"""bench/agent_bench.py runs, on a real Docker sandbox, and measures what it says: a few steps of
each kind, before and now. The figures are not checked against a bound (timing is the bench's
job); what is checked is what does not depend on the machine: the checkpoints each version takes
and the trajectory bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_bench  # bench/ is a folder of scripts, not a package
from sandbox_bench import make_repo

pytestmark = [pytest.mark.docker, pytest.mark.slow]


async def test_the_agent_bench_measures_both_versions(tmp_path: Path) -> None:
    out = await agent_bench.measure(make_repo(tmp_path), tmp_path, steps=3, rounds=1)
    assert set(out) == {"shell-before", "shell-now", "editor-before", "editor-now"}
    for row in out.values():
        assert len(row["step"]) == 3 and all(s > 0 for s in row["step"])  # 3 calls + finish: 3 gaps
        assert all(0 <= box <= step for box, step in zip(row["sandbox"], row["step"], strict=True))
    # Each turn and output stored once, the stream left out: fewer bytes a step than every event whole.
    for kind in ("shell", "editor"):
        assert out[f"{kind}-now"]["bytes"][0] < out[f"{kind}-before"]["bytes"][0]
    section = agent_bench.report(out, 3, 1)
    assert section.startswith(agent_bench.START) and section.endswith(agent_bench.END)
    assert "| shell `echo` | now |" in section and "Ratios before / now" in section
