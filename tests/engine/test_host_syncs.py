"""A block step on the CPU path moves nothing between host and device in either direction, a
decoding call reads back only each pass's one documented result and uploads only through
``upload`` (asynchronous), and a step has no data-dependent Python control flow (it is capturable).

On a GPU every tensor -> Python conversion (``.item()``, ``.tolist()``, ``bool(t)``, a boolean-mask
index, ``nonzero``...) waits for the device, and so does every tensor built from Python numbers on
it (``torch.tensor(values, device="cuda")`` copies from pageable memory, then synchronises the
stream; a list used as an index is such a tensor). :func:`transfers` counts both kinds while code
runs on the CPU, where the same calls are made; ``engine/ops/transfer.upload`` (pinned memory, an
asynchronous copy) is counted apart as a queued upload. Capturability is checked with
``torch.compile(fullgraph=True)`` and the eager backend: dynamo traces the step and fails on any
graph break, which a data-dependent branch or a host read causes (no code is generated, so this runs
anywhere).
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from clover_agent.engine.decoding.choice import choose_tokens, low_confidence_fill
from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.engine import Engine
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.ops.transfer import upload

TENSOR_READS = (
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
    "numpy",
    "unique",
)
TORCH_READS = ("nonzero", "unique", "masked_select", "bincount", "equal", "allclose")
#: Tensors built from Python data (on a GPU: a blocking copy to the device).
TORCH_UPLOADS = ("tensor", "as_tensor", "asarray", "from_numpy")
TENSOR_UPLOADS = ("new_tensor",)


class HostReads:
    """Transfers of one kind seen while counting (``where``: the caller of each)."""

    def __init__(self) -> None:
        self.where: list[str] = []

    def __len__(self) -> int:
        return len(self.where)

    def note(self, what: str) -> None:
        frame = next(
            (f for f in reversed(traceback.extract_stack()[:-2]) if "site-packages/torch" not in f.filename),
            None,
        )
        self.where.append(f"{what} at {frame.filename}:{frame.lineno}" if frame else what)


class Transfers:
    """``reads``: device -> host; ``uploads``: host -> device that wait for the device; ``queued``:
    asynchronous uploads through ``upload``."""

    def __init__(self) -> None:
        self.reads, self.uploads, self.queued = HostReads(), HostReads(), HostReads()


def _host_data(value: object) -> bool:
    return not isinstance(value, torch.Tensor)


def _list_index(index: object) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, list) for p in parts)


@contextmanager
def transfers() -> Iterator[Transfers]:
    seen = Transfers()
    patched: list[tuple[object, str, object]] = []

    def counting(owner: object, name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.reads.note(f"{getattr(owner, '__name__', owner)}.{name}")
            return original(*args, **kwargs)

        return wrapper

    def uploading(owner: object, name: str, original: Callable, data_at: int) -> Callable:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            if len(args) > data_at and _host_data(args[data_at]):
                queued = sys._getframe(1).f_code is upload.__code__
                (seen.queued if queued else seen.uploads).note(f"{getattr(owner, '__name__', owner)}.{name}")
            return original(*args, **kwargs)

        return wrapper

    def copying(name: str, original: Callable) -> Callable:
        """``to``/``copy_`` from the CPU to another device without ``non_blocking`` (GPU runs)."""

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if name == "copy_" and args and isinstance(args[0], torch.Tensor):
                source, target = args[0].device, self.device
            else:
                source = self.device
                target = next((torch.device(a) for a in args if isinstance(a, (str, torch.device))), source)
                target = torch.device(kwargs.get("device", target))
            blocking = not kwargs.get("non_blocking", False)
            if source.type == "cpu" and target.type != "cpu" and blocking:
                seen.uploads.note(f"Tensor.{name} to {target}")
            return original(self, *args, **kwargs)

        return wrapper

    def indexing(original: Callable) -> Callable:
        def wrapper(self, index, *value):  # type: ignore[no-untyped-def]
            parts = index if isinstance(index, tuple) else (index,)
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                seen.reads.note("boolean-mask index")
            if _list_index(index):
                seen.uploads.note("list index")
            return original(self, index, *value)

        return wrapper

    for owner, names in ((torch.Tensor, TENSOR_READS), (torch, TORCH_READS)):
        for name in names:
            original = getattr(owner, name)
            patched.append((owner, name, original))
            setattr(owner, name, counting(owner, name, original))
    for owner, names, data_at in ((torch, TORCH_UPLOADS, 0), (torch.Tensor, TENSOR_UPLOADS, 1)):
        for name in names:
            original = getattr(owner, name)
            patched.append((owner, name, original))
            setattr(owner, name, uploading(owner, name, original, data_at))
    for name in ("to", "copy_"):
        patched.append((torch.Tensor, name, getattr(torch.Tensor, name)))
        setattr(torch.Tensor, name, copying(name, getattr(torch.Tensor, name)))
    for name in ("__getitem__", "__setitem__"):
        patched.append((torch.Tensor, name, getattr(torch.Tensor, name)))
        setattr(torch.Tensor, name, indexing(getattr(torch.Tensor, name)))
    try:
        yield seen
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


@contextmanager
def host_reads() -> Iterator[HostReads]:
    """Device -> host reads only (see :func:`transfers`)."""
    with transfers() as seen:
        yield seen.reads


@pytest.fixture(scope="module")
def model(two_layer_checkpoint: Path) -> CloverModel:
    return Engine.from_pretrained(two_layer_checkpoint, progress=None).model


def committed_cache(model: CloverModel, attention: str, length: int = 64) -> ModelCache:
    cache = model.new_cache(256)
    model(torch.arange(5, 5 + length), cache, attention=attention, commit=True, logit_rows=0)
    return cache


def block_steps(model: CloverModel) -> dict[str, tuple[str, Callable[..., torch.Tensor]]]:
    """Every fixed-shape step of the decoding modes: (the rule of the cache it runs on, the step)."""
    mask = model.config.mask_token_id
    block = torch.full((32,), mask)
    two_blocks = torch.cat([torch.arange(40, 72), block])

    def run(rule: str, ids: torch.Tensor, **kwargs: object) -> Callable[..., torch.Tensor]:
        def step(cache: ModelCache, length: torch.Tensor | None = None) -> torch.Tensor:
            return model(ids, cache, attention=rule, length=length, **kwargs)  # type: ignore[arg-type]

        return step

    return {
        "denoise 32": ("block", run("block", block, logit_rows=32)),
        "commit 32 without lm_head": ("block", run("block", block, commit=True, logit_rows=0)),
        "commit fused with the next first denoise (64)": (
            "block",
            run("block", two_blocks, commit=32, logit_rows=32),
        ),
        "causal-context commit fused (64)": (
            "causal",
            run("block", two_blocks, commit=32, causal_prefix=32, logit_rows=32),
        ),
        "draft on a causal cache (40)": ("causal", run("block", torch.cat([torch.arange(5, 13), block]))),
        "verify 64": ("causal", run("causal", torch.arange(10, 74), commit=32, logit_rows=33)),
        "autoregressive token": ("causal", run("causal", torch.tensor([7]), commit=True)),
    }


#: Traced (tracing is slow): between them every code path of the steps above (block and causal
#: rows in one pass, GDN commit inside a pass, the bidirectional branch, a causal mask, lm_head rows).
CAPTURED = ("causal-context commit fused (64)", "verify 64")


def test_no_block_step_moves_data_between_host_and_device(model: CloverModel) -> None:
    caches = {rule: committed_cache(model, rule) for rule in ("block", "causal")}
    for name, (rule, step) in block_steps(model).items():
        step(caches[rule].clone(256))  # warm: lazily built tables
        cache = caches[rule].clone(256)
        with transfers() as seen:
            step(cache)
        assert len(seen.reads) == 0, f"{name}: {seen.reads.where}"
        assert len(seen.uploads) + len(seen.queued) == 0, f"{name}: {seen.uploads.where} {seen.queued.where}"


def test_the_counter_sees_transfers_both_ways(model: CloverModel) -> None:
    """The counter is not blind: a prefill chunk longer than the fixed MoE grid reads the
    busiest expert's count once per layer, and each kind of read-back and of upload is seen."""
    with host_reads() as prefill:
        model(torch.arange(5, 105), model.new_cache(), attention="block", logit_rows=0)
    # per MoE layer: the counts' size (bincount) and the largest one (the padded grid's rows)
    assert [w.split(" at ")[0] for w in prefill.where] == ["torch.bincount", "Tensor.__int__"] * 2
    with host_reads() as reads:
        x = torch.ones(3)
        _ = bool(x.any()), x.tolist(), x[x > 0], int(x[0])
    assert [w.split(" at ")[0] for w in reads.where] == [
        "Tensor.__bool__",
        "Tensor.tolist",
        "boolean-mask index",
        "Tensor.__int__",
    ]
    with transfers() as seen:
        x = torch.zeros(4)
        _ = torch.tensor([1, 2]), torch.as_tensor([3.0]), x.new_tensor([0.5]), x[[0, 2]], torch.as_tensor(x)
        x[[1]] = 2.0
        queued = upload([1, 2, 3], x.device)
    assert [w.split(" at ")[0] for w in seen.uploads.where] == [
        "torch.tensor",
        "torch.as_tensor",
        "Tensor.new_tensor",
        "list index",
        "list index",
    ]
    assert [w.split(" at ")[0] for w in seen.queued.where] == ["torch.tensor"]
    assert queued.tolist() == [1, 2, 3] and len(seen.reads) == 0


@pytest.mark.parametrize("mode", ["diffusion", "self_speculative", "autoregressive"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"fuse_commit": True, "repetition_penalty": 1.3, "temperature": 0.8},
        {"thinking": True, "thinking_budget": 30, "think_end_token_id": 9, "end_bias_start": 0.5},
    ],
)
def test_one_read_back_per_pass_that_chooses_tokens(model: CloverModel, mode: str, options: dict) -> None:
    """A whole call reads the device once per pass that chooses tokens (denoise, draft, verify,
    autoregressive token) and never in prefill (a short prompt), commit or fused passes; nothing
    it sends to the device waits for the device (every upload is queued, none blocks)."""
    decoder = BlockDecoder(model)  # no prefix cache: its keys are hashed on the host
    params = SamplingParams(max_new_tokens=80, mode=mode, stop_token_ids=(), seed=1, **options)
    prompt = list(range(5, 45))
    with transfers() as seen:
        result = decoder.generate(prompt, params)
    assert len(seen.reads) == sum(result.steps_per_block), seen.reads.where
    assert len(seen.uploads) == 0, seen.uploads.where
    assert len(seen.queued) >= result.forwards  # the ids of every forward
    assert result.forwards > sum(result.steps_per_block) or options or mode != "diffusion"


@pytest.mark.slow
def test_block_steps_are_capturable(model: CloverModel) -> None:
    """dynamo traces each kind of step whole (fullgraph: a graph break is an error) and the traced
    step computes what the eager one does, committed state included."""
    caches = {rule: committed_cache(model, rule) for rule in ("block", "causal")}
    steps = block_steps(model)
    torch._dynamo.reset()
    for name in CAPTURED:
        rule, step = steps[name]
        eager_cache, traced_cache = caches[rule].clone(256), caches[rule].clone(256)
        expected = step(eager_cache)
        traced = torch.compile(step, backend="eager", fullgraph=True)
        # The traced graph runs the same ops, but its tensors' layouts may differ, so BLAS/oneDNN
        # may pick other kernels and reduction orders: float32 logits (up to ~80) missed the default
        # tolerance by 1.1e-5 on an AMD EPYC. 1e-4 leaves room for that on any CPU; a wrong mask or
        # state moves them by O(0.1) and more.
        torch.testing.assert_close(traced(traced_cache), expected, rtol=1e-4, atol=1e-4, msg=name)
        assert traced_cache.length == eager_cache.length, name
        for got, want in zip(traced_cache.tensors(), eager_cache.tensors(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)  # as the logits
    # ... and in the form a CUDA graph captures (the length in device memory).
    rule, step = steps[CAPTURED[0]]
    cache = caches[rule].clone(256)
    traced = torch.compile(step, backend="eager", fullgraph=True)
    got = traced(cache, length=torch.tensor(cache.length))
    torch.testing.assert_close(got, step(caches[rule].clone(256)), rtol=1e-4, atol=1e-4)  # as above


def test_steps_reading_the_length_from_device_memory_match(model: CloverModel) -> None:
    """The CUDA-graph form of each step (``length=`` a device tensor: positions, K/V rows and the
    attention mask from device memory) computes what the host-length form does, without host reads."""
    caches = {rule: committed_cache(model, rule) for rule in ("block", "causal")}
    for name, (rule, step) in block_steps(model).items():
        expected_cache, cache = caches[rule].clone(256), caches[rule].clone(256)
        expected = step(expected_cache)
        length = torch.tensor(cache.length)
        with transfers() as seen:
            got = step(cache, length=length)
        assert len(seen.reads) + len(seen.uploads) + len(seen.queued) == 0, f"{name}: {vars(seen)}"
        # Positions and masks from device memory: attention runs over the whole buffer, masked, so
        # its reductions have other lengths and orders. float32 logits up to ~80 moved by 2.3e-5 on
        # an Intel Xeon (88% of a 1e-5 tolerance); 1e-4 as for the traced steps above.
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=name)
        for a, b in zip(cache.tensors(), expected_cache.tensors(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.slow
def test_greedy_token_choice_is_capturable() -> None:
    logits = torch.randn(32, 300, generator=torch.Generator().manual_seed(0)) * 4

    def choose(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens, confidence = choose_tokens(rows, SamplingParams(), 299, None)
        return (tokens, *low_confidence_fill(confidence, 0.9))

    torch._dynamo.reset()
    traced = torch.compile(choose, backend="eager", fullgraph=True)
    for got, want in zip(traced(logits), choose(logits), strict=True):
        # exact: token ids, the fill mask and the fallback flag (no confidence lies near 0.9 here)
        assert torch.equal(got, want)


def test_short_prefill_needs_no_read(model: CloverModel) -> None:
    with transfers() as seen:
        committed_cache(model, "block", 64)
    assert len(seen.reads) == 0 and len(seen.uploads) == 0, (seen.reads.where, seen.uploads.where)


def test_cuda_graphs_stay_off_without_cuda(model: CloverModel) -> None:
    """The graph path (``graphs.py``) runs on CUDA only; asking for it on the CPU changes nothing."""
    from clover_agent.engine.decoding.graphs import StepGraphs

    decoder = BlockDecoder(model, cuda_graphs=True)
    assert decoder.cuda_graphs is False
    params = SamplingParams(max_new_tokens=40)
    assert (
        decoder.generate(list(range(5, 45)), params).token_ids
        == BlockDecoder(model).generate(list(range(5, 45)), params).token_ids
    )
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        StepGraphs(model, model.new_cache())
