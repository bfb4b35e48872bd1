"""CUDA-graph capture of the fixed-shape decoding steps (CUDA only; the CPU never gets here).

A block step has a fixed shape and reads no tensor value on the host, so it can be captured once
and replayed: one launch instead of thousands (:class:`StepGraphs`). The decoder captures on its
workspace (``BlockDecoder.workspace_for``), so one capture per step shape serves every later call.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from clover_agent.engine.model.cache import AttentionKV, ModelCache
from clover_agent.engine.model.network import AttentionRule, CloverModel

log = logging.getLogger("clover_agent.engine")


@dataclass(frozen=True)
class StepShape:
    tokens: int
    attention: AttentionRule
    commit: int
    causal_prefix: int
    logit_rows: int


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, ids: torch.Tensor, out: torch.Tensor) -> None:
        self.graph, self.ids, self.out = graph, ids, out


class StepGraphs:
    """Captured forwards of ``model`` on ``cache``, one per step shape, captured on first use.

    The shapes: 1 token, a block's denoise, a block's commit without LM head, two blocks for a
    commit fused with the next first pass or a verify. What varies between replays lives in device
    memory: the token ids (a static input buffer) and the committed length (a 0-d tensor the model
    reads with ``length=``: positions, K/V rows and the attention mask come from it). A graph
    belongs to one cache's buffers; the Python bookkeeping a forward does after its kernels
    (``cache.advance`` on a commit) is done here after each replay.

    Capturing runs the forward twice first (warm-up: lazy initialisation, library workspaces) on a
    side stream; the committed state those runs write is saved before and restored after, so a
    capture changes nothing, not even when it fails: that shape then runs eager (``failed``, and
    the log names it).
    """

    def __init__(self, model: CloverModel, cache: ModelCache) -> None:
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.cache = model, cache
        self.length = torch.zeros((), dtype=torch.long, device=model.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[StepShape, _Captured] = {}
        #: Shapes whose capture failed, with why: they run eager.
        self.failed: dict[StepShape, str] = {}
        self.captures = self.replays = 0

    def fits(self, shape: StepShape) -> bool:
        """Whether the step fits the buffers the graphs were captured on (a cache that grew has new ones)."""
        return shape not in self.failed and self.cache.length + shape.tokens <= self.cache.capacity

    def __call__(self, ids: torch.Tensor, shape: StepShape) -> torch.Tensor | None:
        """The step's logits (a static buffer: read it before the next replay), or None when the
        shape cannot be captured (run it eager). Call :meth:`fits` first."""
        captured = self.graphs.get(shape) or self._try_capture(shape)
        if captured is None:
            return None
        captured.ids.copy_(ids, non_blocking=True)  # device to device
        self.length.fill_(self.cache.length)  # a fill kernel: no copy from the host
        captured.graph.replay()
        self.replays += 1
        if shape.commit:
            self.cache.advance(shape.commit)
        return captured.out

    def _forward(self, ids: torch.Tensor, shape: StepShape) -> torch.Tensor:
        return self.model(
            ids,
            self.cache,
            attention=shape.attention,
            commit=shape.commit or False,
            causal_prefix=shape.causal_prefix,
            logit_rows=shape.logit_rows,
            length=self.length,
        )

    def _try_capture(self, shape: StepShape) -> _Captured | None:
        cache = self.cache
        # A commit writes the GDN states in place and moves the length: keep both to restore them.
        saved = [t.clone() for layer in cache.layers for t in layer.tensors()]
        length, commits = cache.length, cache.commits
        started = time.perf_counter()
        try:
            captured = self._capture(shape)
        except Exception as exc:
            self.failed[shape] = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture of step %s failed (%s): that step runs eager", shape, exc)
            return None
        finally:
            self._rewind(length, commits)
            for target, value in zip(
                (t for layer in cache.layers for t in layer.tensors()), saved, strict=True
            ):
                target.copy_(value)
        self.captures += 1
        log.debug("captured step %s in %.0f ms", shape, (time.perf_counter() - started) * 1e3)
        self.graphs[shape] = captured
        return captured

    def _capture(self, shape: StepShape) -> _Captured:
        cache = self.cache
        length, commits = cache.length, cache.commits
        self.cache.reserve(length + shape.tokens)
        self.length.fill_(length)
        ids = torch.full((shape.tokens,), self.model.config.mask_token_id or 0, device=self.model.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(ids, shape)
                self._rewind(length, commits)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(ids, shape)
        return _Captured(graph, ids, out)

    def _rewind(self, length: int, commits: int) -> None:
        cache = self.cache
        cache.length, cache.commits = length, commits
        for layer in cache.layers:
            if isinstance(layer, AttentionKV):
                layer.length = length
