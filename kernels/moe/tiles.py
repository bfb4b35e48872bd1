"""Tile shapes of the grouped expert GEMMs: a heuristic default, and tables tuned on a GPU.

A table (JSON, written by ``python -m clover_agent.kernels.moe.tune``) holds, per GEMM problem
(experts, hidden, inner, top-k, dtype, weight format), the fastest :class:`Tiles` measured at a few
token counts; a call takes the entry of the nearest measured count, as vLLM's tuned fused-MoE
configs do. Tables ship in ``kernels/moe/tuned/``, one per GPU model (the file named after
``torch.cuda.get_device_name``); ``CLOVER_MOE_TILES`` names another table file. Without an
entry the heuristic applies: 16 rows a tile while experts get a few pairs each (decoding), 32 or
64 in prefill, 64 columns, 64 inputs per K step.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

#: Inputs per K step at most (a quantised weight's scale block must hold whole steps).
MAX_BLOCK_K = 64
#: The folder of the shipped tables.
TABLES = Path(__file__).with_name("tuned")
#: Environment variable naming a table to use instead of the shipped one.
TABLE_VARIABLE = "CLOVER_MOE_TILES"


@dataclass(frozen=True)
class Tiles:
    """One launch shape of both grouped GEMMs (gate/up and down)."""

    block_m: int
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name.startswith("block") and (value < 16 or value & (value - 1)):
                raise ValueError(f"{name} must be a power of two of at least 16, not {value}")
        if self.num_warps not in (1, 2, 4, 8, 16) or not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_warps {self.num_warps} / num_stages {self.num_stages} out of range")


def block_m_for(pairs: int, num_experts: int) -> int:
    """Rows per grouped-GEMM tile: 16 when experts get a few pairs each (decoding), more in prefill."""
    per_expert = pairs / num_experts
    if per_expert <= 16:
        return 16
    return 32 if per_expert <= 48 else 64


def problem_key(experts: int, hidden: int, inner: int, top_k: int, dtype: torch.dtype, quant: str) -> str:
    """The table key of one GEMM problem, e.g. ``E256-H2048-I512-K8-bfloat16-fp8``."""
    return f"E{experts}-H{hidden}-I{inner}-K{top_k}-{str(dtype).removeprefix('torch.')}-{quant}"


@functools.lru_cache(maxsize=16)
def device_table_name(device: torch.device) -> str:
    """The shipped table's file name for ``device``'s GPU model (``NVIDIA H200`` -> ``nvidia_h200.json``)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + ".json"


def table_path(device: torch.device) -> Path:
    named = os.environ.get(TABLE_VARIABLE)
    return Path(named) if named else TABLES / device_table_name(device)


@functools.lru_cache(maxsize=16)
def _read(path: Path, named: bool) -> dict[str, dict[int, Tiles]]:
    """The table at ``path``, read once per process (every MoE launch asks: no file system access
    on that path after the first); ``named``: the path came from the environment variable."""
    if not path.is_file():
        if named:
            raise ValueError(f"{TABLE_VARIABLE} names {path}, which is not a file")
        return {}
    try:
        raw = json.loads(path.read_text())
        return {
            key: {int(tokens): Tiles(**tiles) for tokens, tiles in by_tokens.items()}
            for key, by_tokens in raw["problems"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"the MoE tile table {path} cannot be read: {exc}") from exc


def load_table(path: Path) -> dict[str, dict[int, Tiles]]:
    """``{problem key: {tokens: Tiles}}`` from a table file ({} when there is none), read once."""
    return _read(path, bool(os.environ.get(TABLE_VARIABLE)))


def tiles_for(
    tokens: int,
    *,
    experts: int,
    hidden: int,
    inner: int,
    top_k: int,
    dtype: torch.dtype,
    quant: str,
    device: torch.device,
    scale_k: int | None = None,
) -> Tiles:
    """The tiles of a call over ``tokens`` tokens: the table's entry at the nearest measured token
    count, else the heuristic; ``block_k`` at most ``scale_k``, a quantised weight's scale block
    along K (whole scale blocks per K step; None: dense weights)."""
    measured = load_table(table_path(device)).get(problem_key(experts, hidden, inner, top_k, dtype, quant))
    if measured:
        nearest = min(measured, key=lambda count: (abs(count - tokens), count))
        chosen = measured[nearest]
    else:
        chosen = Tiles(block_m_for(tokens * top_k, experts), block_k=MAX_BLOCK_K)
    if scale_k is not None and chosen.block_k > scale_k:
        chosen = Tiles(**{**asdict(chosen), "block_k": scale_k})
    return chosen


def write_table(
    path: Path, device_name: str, problems: dict[str, dict[int, Tiles]], notes: dict[str, Any]
) -> None:
    """Write (merging into an existing file's problems) a table."""
    merged: dict[str, Any] = {}
    if path.is_file():
        merged = json.loads(path.read_text()).get("problems", {})
    for key, by_tokens in problems.items():
        merged.setdefault(key, {}).update({str(t): asdict(tiles) for t, tiles in sorted(by_tokens.items())})
    body = {"device": device_name, "notes": notes, "problems": merged}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    _read.cache_clear()  # a table read before this write is stale now
