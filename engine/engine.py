"""``Engine``: a loaded Clover checkpoint (model, config, tokenizer) and its entry points."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import torch

from clover_agent.engine.decoding.decoder import BlockDecoder
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import GenerationResult, SamplingParams
from clover_agent.engine.decoding.stream import StreamEvent
from clover_agent.engine.loading.weights import load_model
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.network import CloverModel
from clover_agent.engine.ops import KernelChoice
from clover_agent.engine.text.tokenizer import Tokenizer, load_tokenizer


class Engine:
    """The in-process engine. Build it with :meth:`from_pretrained`."""

    def __init__(
        self,
        model: CloverModel,
        config: CloverConfig,
        tokenizer: Tokenizer | None,
        *,
        model_dir: Path,
        cuda_graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        weight = model.embed_tokens.weight
        self.device: torch.device = weight.device
        self.dtype: torch.dtype = weight.dtype
        #: Committed state of earlier calls, reused when a prompt extends one (see prefix_cache.py).
        self.prefix_cache = PrefixCache()
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        self.decoder = BlockDecoder(model, tokenizer, self.prefix_cache, cuda_graphs=cuda_graphs)

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        kernels: KernelChoice = "auto",
        *,
        progress: TextIO | None = sys.stderr,
        cuda_graphs: bool | None = None,
        experts: str = "auto",
        int4_group: int = 128,
        experts_on: str = "device",
    ) -> Engine:
        """Load a Hugging Face style checkpoint folder. ``progress=None`` loads quietly.

        - ``kernels``: per-operator implementation choice (``ops.py``).
        - ``cuda_graphs``: replay the fixed-shape decoding steps as CUDA graphs (``graphs.py``); None (the
          default): on where the model is on a CUDA device. :meth:`decoding_steps` says how they run.
        - ``experts``: the routed experts as stored (``"auto"``: an FP8 checkpoint's stay FP8), ``"dense"``
          in ``dtype``, or quantised on load to ``"fp8"`` or ``"int4"`` (``int4_group`` inputs per scale).
        - ``experts_on``: ``"device"`` (the default) or ``"host"``: the routed experts in host memory,
          computed by the CPU, everything else on ``device``; the steps then run eager (docs/serving.md).

        CUDA graphs are captured once per step shape and reused by every later call. Quantisation:
        docs/quantization.md.

        With the Triton MoE, its tile table (``CLOVER_MOE_TILES`` or the GPU's shipped one) is read here: a
        bad one is a ``ValueError`` now, not in the middle of an answer. The tokenizer is optional: a folder
        without ``tokenizer.json`` gives ``tokenizer=None``.
        """
        model_dir = Path(model_dir)
        model, config = load_model(
            model_dir,
            device=device,
            dtype=dtype,
            kernels=kernels,
            progress=progress,
            experts=experts,
            int4_group=int4_group,
            experts_on=experts_on,
        )
        if model.ops.backends["sparse_moe"] == "triton":
            from clover_agent.kernels.moe.tiles import load_table, table_path

            load_table(table_path(model.device))
        return cls(model, config, load_tokenizer(model_dir), model_dir=model_dir, cuda_graphs=cuda_graphs)

    def decoding_steps(self) -> str:
        """How the fixed-shape decoding steps run, in words (for a log line)."""
        decoder = self.decoder
        if decoder.cuda_graphs:
            graphs = decoder.step_graphs
            failed = graphs.failed if graphs is not None else {}
            if failed:
                shapes = "; ".join(f"{shape}: {why}" for shape, why in failed.items())
                return f"CUDA graphs, but these steps run eager, their capture failed: {shapes}"
            return (
                "CUDA graphs (captured once per step shape, a denoising pass with its token choice, "
                "reused by every call)"
            )
        if decoder.eager_reason is not None:
            return f"eager: {decoder.eager_reason}"
        return "eager (CUDA graphs off)"

    def logits(self, input_ids: list[int]) -> torch.Tensor:
        """Float32 logits [T, vocab] of a plain causal forward over ``input_ids`` from an empty cache."""
        bad = [t for t in input_ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"input_ids outside the vocabulary [0, {self.config.vocab_size}): {bad[:5]}")
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        return self.model(ids, self.model.new_cache(), attention="causal")

    def default_params(self, **overrides: object) -> SamplingParams:
        """The contract's parameters with this checkpoint's block size and threshold, then
        ``overrides`` (see :meth:`SamplingParams.for_model`)."""
        return SamplingParams.for_model(self.config, **overrides)

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> GenerationResult:
        """Decode after ``prompt_ids`` (see decoding.py); ``params`` defaults to :meth:`default_params`."""
        return self.decoder.generate(prompt_ids, params if params is not None else self.default_params())

    def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Iterator[StreamEvent]:
        """Events of one call: ``BlockProgress``, ``BlockCommitted``, then ``GenerationDone``."""
        return self.decoder.stream(prompt_ids, params if params is not None else self.default_params())
