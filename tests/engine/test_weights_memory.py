"""Loading keeps host memory near one shard beyond the model: ``load_model`` reads the checkpoint
tensor by tensor, shard by shard, never the whole checkpoint at once.

A real sharded float32 checkpoint (~200 MB in 8 shards) is loaded onto the CPU in a fresh
process, which reports its peak resident memory against its resident memory just before loading
(torch, the loader and the modules the model imports loaded; no weights anywhere). The peak is the
process's ``VmHWM``, reset just before loading, not ``ru_maxrss``: Linux carries a parent's peak
over into ``ru_maxrss`` of a child it spawns (here, the test process that just wrote the checkpoint).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.engine.loading.tiny import write_tiny_checkpoint

MIB = 1 << 20
#: Room for what is not the model or a shard: allocator and interpreter overhead while loading.
SLACK_BYTES = 48 * MIB

MEASURE = """
import json, sys
from pathlib import Path
import torch
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.loading.weights import load_model

def status_bytes(field):
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # reported in kB

# Building the model imports its kernels' modules (triton, sympy: ~150 MB of code and data).
# A model on the meta device holds no memory, so this counts imports, not weights, before 'before'.
with torch.device("meta"):
    CloverModel(CloverConfig.from_file(Path(sys.argv[1]) / "config.json"))
with open("/proc/self/clear_refs", "w") as clear_refs:
    clear_refs.write("5")  # reset the peak (VmHWM) to the current resident size
before = status_bytes("VmRSS")
model, _ = load_model(sys.argv[1], device="cpu", progress=None)
peak = status_bytes("VmHWM")
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"growth": peak - before, "model_bytes": model_bytes}))
"""


@pytest.mark.slow
def test_loading_holds_about_one_shard_beyond_the_model(tmp_path: Path) -> None:
    model_dir = write_tiny_checkpoint(
        tmp_path / "model",
        shards=8,
        tokenizer=False,
        overrides={"hidden_size": 256, "num_experts": 64, "moe_intermediate_size": 256},
    )
    shards = [p.stat().st_size for p in model_dir.glob("*.safetensors")]
    assert len(shards) == 8 and sum(shards) > 150 * MIB
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(model_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    growth, model_bytes = measured["growth"], measured["model_bytes"]
    checkpoint_bytes, largest_shard = sum(shards), max(shards)
    assert model_bytes > 0.9 * checkpoint_bytes  # float32 both: the checkpoint is the model
    report = (
        f"peak growth {growth / MIB:.0f} MiB; model {model_bytes / MIB:.0f} MiB, "
        f"checkpoint {checkpoint_bytes / MIB:.0f} MiB, largest shard {largest_shard / MIB:.0f} MiB"
    )
    assert growth <= model_bytes + 1.5 * largest_shard + SLACK_BYTES, report
    # A loader that read the whole checkpoint before copying it would need model + checkpoint.
    assert growth < model_bytes + 0.5 * checkpoint_bytes, report
