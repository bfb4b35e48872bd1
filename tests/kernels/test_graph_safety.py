"""On a CUDA GPU: every kernel case runs without a host synchronisation and replays from a CUDA graph
with the eager result (the launches read nothing back, and their grids are fixed per shape)."""

from __future__ import annotations

import pytest
import torch

from clover_agent.kernels.cases import cases
from tests.kernels.test_bench import TINY

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cases_run_without_sync_and_replay_from_a_graph(dtype: torch.dtype) -> None:
    for case in cases(
        device="cuda", dtype=dtype, sizes=TINY, tokens=(6, 32), prefill_tokens=(100,), context=50, copies=1
    ):
        eager = case.run()  # compiles the kernels
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            case.run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = case.run()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(  # exact: the same launches on the same inputs, replayed
            captured, eager, rtol=0, atol=0, msg=lambda m, name=case.name: f"{name}: {m}"
        )
