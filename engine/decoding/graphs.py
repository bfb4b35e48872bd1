"""CUDA-graph capture of the fixed-shape decoding steps (CUDA; rehearsed on any device by tests).

A block step has a fixed shape and reads no tensor value on the host, so it can be captured once
and replayed: one launch instead of thousands (:class:`StepGraphs`). The decoder captures on its
workspace (``BlockDecoder.workspace_for``), so one capture per step shape serves every later call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from clover_agent.engine.model.cache import AttentionKV, ModelCache
from clover_agent.engine.model.network import AttentionRule, CloverModel
from clover_agent.engine.ops.transfer import upload

log = logging.getLogger("clover_agent.engine")

#: Captured steps kept per workspace at most: a new key past it runs eager (a call whose repetition
#: penalty keeps rising, ``loop_action="penalize"``, would otherwise capture a pass per repeat).
MAX_GRAPHS = 24


@dataclass(frozen=True)
class StepShape:
    tokens: int
    attention: AttentionRule
    commit: int
    causal_prefix: int
    logit_rows: int


#: What a step program returns: its output tensors (a graph's static outputs).
Outputs = tuple[torch.Tensor, ...]
#: A step program: runs a step on its static input ids, returns its outputs.
Body = Callable[[torch.Tensor], Outputs]


class _Captured:
    def __init__(self, replay: Callable[[], None], ids: torch.Tensor, outs: Outputs) -> None:
        self.replay, self.ids, self.outs = replay, ids, outs


class StepGraphs:
    """Captured steps of ``model`` on ``cache``, one per step shape, captured on first use.

    The shapes: 1 token, a block's denoise, a block's commit without LM head, two blocks for a commit
    fused with the next first pass or a verify.

    What varies between replays lives in device memory: the token ids (a static input buffer) and the
    committed length (a 0-d tensor the model reads with ``length=``: positions, K/V rows and the
    attention mask come from it). A graph belongs to one cache's buffers; the Python bookkeeping a
    forward does after its kernels (``cache.advance`` on a commit) is done here after each replay.

    Besides the bare forward (``__call__``), a step can be a *program* (:meth:`run`): the forward
    and whatever follows it on the device, e.g. a denoising pass's token choice
    (``fused_choice.ChoiceProgram``), captured as one graph per (shape, variant) key.

    Capturing runs the step twice first (warm-up: lazy initialisation, library workspaces) on a
    side stream; the committed state those runs write, and the tensors a program updates in place,
    are saved before and restored after, so a capture changes nothing, not even when it fails: that
    key then runs eager (``failed``, and the log names it).

    ``rehearse=True`` does all of this without CUDA (any device): a "capture" runs the warm-ups and
    the restore, a "replay" runs the step eagerly and copies its outputs into the static ones. It is
    how the CPU tests exercise what a GPU replays, everything but the graph itself.
    """

    def __init__(self, model: CloverModel, cache: ModelCache, *, rehearse: bool = False) -> None:
        if model.device.type != "cuda" and not rehearse:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.cache, self.rehearse = model, cache, rehearse
        self.length = torch.zeros((), dtype=torch.long, device=model.device)
        self.pool = None if rehearse else torch.cuda.graph_pool_handle()
        self.graphs: dict[Hashable, _Captured] = {}
        #: Keys (a bare step's shape, or a program's key) whose capture failed, with why: they run eager.
        self.failed: dict[Hashable, str] = {}
        self.captures = self.replays = 0
        #: Whether a step was left eager because :data:`MAX_GRAPHS` were captured.
        self.full = False
        #: Replays by key.
        self.replayed: Counter[Hashable] = Counter()

    def fits(self, shape: StepShape, key: Hashable | None = None) -> bool:
        """Whether the step fits the buffers the graphs were captured on (a cache that grew has new
        ones), its capture has not failed, and it is captured or there is room for it
        (:data:`MAX_GRAPHS`); ``key``: a program's, else the shape is the key."""
        key = shape if key is None else key
        if key in self.failed:
            return False
        if key not in self.graphs and len(self.graphs) >= MAX_GRAPHS:
            if not self.full:
                log.info(
                    "%d steps captured, the most kept: new ones run eager (the first: %s)", MAX_GRAPHS, key
                )
            self.full = True
            return False
        return self.cache.length + shape.tokens <= self.cache.capacity

    def __call__(self, ids: torch.Tensor, shape: StepShape) -> torch.Tensor | None:
        """The step's logits (a static buffer: read it before the next replay), or None when the
        shape cannot be captured (run it eager). Call :meth:`fits` first."""

        def bare(static_ids: torch.Tensor) -> Outputs:
            return (self.forward(static_ids, shape),)

        outs = self.run(shape, shape, lambda: bare, ids=ids)
        return None if outs is None else outs[0]

    def run(
        self,
        key: Hashable,
        shape: StepShape,
        make: Callable[[], Body],
        *,
        ids: torch.Tensor | None = None,
        prefix: Sequence[int] = (),
        state: Sequence[torch.Tensor] = (),
    ) -> Outputs | None:
        """Replay ``key``'s graph of the step ``make()`` gives, captured now (from one call of ``make``)
        when the key is new. Call :meth:`fits` first.

        - ``ids``: all the static ids, on the device, set before the replay.
        - ``prefix``: or the first static ids, from the host (uploaded; the step fills the rest itself).
        - ``state``: tensors the step updates in place (besides the cache), kept unchanged by the capture.

        Returns the outputs (static buffers: read them before the next replay), or None when the step
        cannot be captured (run it eager).
        """
        captured = self.graphs.get(key) or self._try_capture(key, shape, make, state)
        if captured is None:
            return None
        if ids is not None:
            captured.ids.copy_(ids, non_blocking=True)  # device to device
        elif prefix:
            upload(list(prefix), captured.ids.device, into=captured.ids[: len(prefix)])
        self.length.fill_(self.cache.length)  # a fill kernel: no copy from the host
        captured.replay()
        self.replays += 1
        self.replayed[key] += 1
        if shape.commit:
            self.cache.advance(shape.commit)
        return captured.outs

    def forward(self, ids: torch.Tensor, shape: StepShape) -> torch.Tensor:
        """The bare forward of ``shape`` on the static ids and length (what a captured step runs)."""
        return self.model(
            ids,
            self.cache,
            attention=shape.attention,
            commit=shape.commit or False,
            causal_prefix=shape.causal_prefix,
            logit_rows=shape.logit_rows,
            length=self.length,
        )

    def _try_capture(
        self, key: Hashable, shape: StepShape, make: Callable[[], Body], state: Sequence[torch.Tensor]
    ) -> _Captured | None:
        cache = self.cache
        # A commit writes the GDN states in place and moves the length: keep both to restore them,
        # and whatever else the program updates in place.
        kept = [t for layer in cache.layers for t in layer.tensors()] + list(state)
        saved = [t.clone() for t in kept]
        length, commits = cache.length, cache.commits
        started = time.perf_counter()
        try:
            captured = self._capture(shape, make())
        except Exception as exc:
            self.failed[key] = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture of step %s failed (%s): that step runs eager", key, exc)
            return None
        finally:
            self._rewind(length, commits)
            for target, value in zip(kept, saved, strict=True):
                target.copy_(value)
        self.captures += 1
        log.debug("captured step %s in %.0f ms", key, (time.perf_counter() - started) * 1e3)
        self.graphs[key] = captured
        return captured

    def _capture(self, shape: StepShape, body: Body) -> _Captured:
        cache = self.cache
        length, commits = cache.length, cache.commits
        self.cache.reserve(length + shape.tokens)
        self.length.fill_(length)
        ids = torch.full((shape.tokens,), self.model.config.mask_token_id or 0, device=self.model.device)
        if self.rehearse:
            for _ in range(2):
                body(ids)
                self._rewind(length, commits)
            outs = tuple(out.clone() for out in body(ids))

            def replay() -> None:
                # an eager forward also does its Python bookkeeping (a commit advances the cache),
                # which a replay does not: undo it, run() does it as after a replay
                before = cache.length, cache.commits
                for static, out in zip(outs, body(ids), strict=True):
                    static.copy_(out)
                self._rewind(*before)

            return _Captured(replay, ids, outs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                body(ids)
                self._rewind(length, commits)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outs = body(ids)
        return _Captured(graph.replay, ids, outs)

    def _rewind(self, length: int, commits: int) -> None:
        cache = self.cache
        cache.length, cache.commits = length, commits
        for layer in cache.layers:
            if isinstance(layer, AttentionKV):
                layer.length = length
