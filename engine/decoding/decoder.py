"""The decoding contract (docs/decoding.md) as one generator of stream events per call.

:class:`BlockDecoder` runs calls on one model and keeps the prefix cache between them; a
:class:`DecodeCall` is one call: validation, counters, the pieces every mode shares (forward,
prefill, one denoising pass, emitting tokens, finishing) and the dispatch to the mode's loop:
:mod:`.diffusion` (the default), :mod:`.speculative` and :mod:`.autoregressive`; token choice is
:mod:`.choice`. Within a pass nothing is read back from the device but the pass's result, once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import torch

from clover_agent.engine.decoding.autoregressive import autoregressive
from clover_agent.engine.decoding.choice import choose_tokens, low_confidence_fill
from clover_agent.engine.decoding.controls import ControlTokens, LogitsControls
from clover_agent.engine.decoding.diffusion import diffusion
from clover_agent.engine.decoding.fused_choice import (
    CHOICES,
    ChoiceProgram,
    FusedChoice,
    fused_choice_problem,
    read_pass,
)
from clover_agent.engine.decoding.graphs import StepGraphs, StepShape
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import FinishReason, GenerationResult, SamplingParams
from clover_agent.engine.decoding.speculative import self_speculative
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone, StreamEvent
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.network import AttentionRule, CloverModel
from clover_agent.engine.ops.transfer import upload
from clover_agent.engine.text.tokenizer import Tokenizer

#: Prefill runs in chunks of at most this many tokens (rounded down to whole blocks).
PREFILL_CHUNK_TOKENS = 4096
#: The smallest workspace (tokens of K/V); it grows by powers of two.
MIN_WORKSPACE_TOKENS = 4096
#: Where the tools' part of the Qwen3.6 chat template's first message ends: the tools and the
#: instructions for calling them close with this tag, and the system prompt's own text follows
#: (engine/text/templates/qwen3.6-chat-template.jinja). Its closing ``>`` is left out: the tokenizer may
#: join it to the newlines after it.
TOOLS_PART_END = "</IMPORTANT"

log = logging.getLogger("clover_agent.engine")


class BlockDecoder:
    """Runs generation calls on one model; keeps the prefix cache between calls."""

    def __init__(
        self,
        model: CloverModel,
        tokenizer: Tokenizer | None = None,
        prefix_cache: PrefixCache | None = None,
        *,
        cuda_graphs: bool = False,
        workspace: bool = False,
        choice: str = "auto",
        rehearse_graphs: bool = False,
    ) -> None:
        self.model = model
        self.config: CloverConfig = model.config
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self._tools_marker: list[int] | None = None
        #: Replay the fixed-shape steps as CUDA graphs (``graphs.py``); only on a CUDA model.
        host_experts = model.experts_on == "host"
        self.cuda_graphs = cuda_graphs and model.device.type == "cuda" and not host_experts
        #: Why steps run eager although graphs were asked for (None: they were not, or they run).
        self.eager_reason: str | None = None
        if cuda_graphs and host_experts:
            self.eager_reason = (
                "the routed experts are in host memory and computed by the CPU (experts_on='host'); "
                "a CUDA graph cannot capture the copies to and from the host"
            )
        elif cuda_graphs and not self.cuda_graphs:
            self.eager_reason = f"the model is on {model.device}, and CUDA graphs need a CUDA device"
        if self.eager_reason is not None:
            log.info("CUDA graphs off: %s; decoding steps run eager", self.eager_reason)
        #: Run every step through ``StepGraphs`` without CUDA: each "replay" runs the step eagerly on
        #: the graphs' static buffers (``StepGraphs(rehearse=True)``), how tests on the CPU check
        #: everything a GPU's graphs do but the graphs themselves.
        self.rehearse_graphs = rehearse_graphs and not self.cuda_graphs
        #: Decode every call in one cache (a snapshot is copied into it) so that the graphs captured
        #: on its buffers serve every later call: always with graphs, else when asked for.
        self.keep_workspace = self.cuda_graphs or self.rehearse_graphs or workspace
        #: Prompt tokens one prefill forward takes at most (whole blocks); a batch keeps it small so a
        #: new request's prefill rides along with the others' passes (``engine/batching.py``).
        self.prefill_chunk = PREFILL_CHUNK_TOKENS
        #: The static buffers of denoising passes captured with their token choice (made on first use).
        self.choice_program: ChoiceProgram | None = None
        self.workspace: ModelCache | None = None
        self.step_graphs: StepGraphs | None = None
        self.current: DecodeCall | None = None  # the call decoding in the workspace
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {', '.join(CHOICES)}, not {choice!r}")
        #: How a denoising pass chooses tokens: ``"torch"`` (choice.py, controls.py), ``"triton"``
        #: (the fused step, fused_choice.py; an error where it cannot run), ``"auto"`` (the fused
        #: step on a CUDA device where the Triton kernels run, else PyTorch).
        self.choice = choice

    def workspace_for(self, tokens: int) -> ModelCache:
        """The workspace, with room for ``tokens``: a new one (and new graphs) when it has not, of
        the next power of two, at most what the context window can use."""
        if self.workspace is not None and self.workspace.capacity >= tokens:
            return self.workspace
        ceiling = self.config.max_position_embeddings + 2 * self.config.block_size
        rows = max(tokens, min(max(MIN_WORKSPACE_TOKENS, 1 << (tokens - 1).bit_length()), ceiling))
        if self.workspace is not None:
            log.info("decoding workspace grows to %d tokens; steps are captured again", rows)
        # Free the old buffers and graphs before the new ones are made (the peak is not old + new):
        # the last call in the workspace lets go of its graphs too.
        if self.current is not None:
            self.current.graphs = None
        self.workspace = self.step_graphs = None
        self.workspace = self.model.new_cache(rows)
        if self.cuda_graphs or self.rehearse_graphs:
            self.step_graphs = StepGraphs(self.model, self.workspace, rehearse=self.rehearse_graphs)
        return self.workspace

    def program(self) -> ChoiceProgram:
        if self.choice_program is None:
            self.choice_program = ChoiceProgram(self.config.block_size, self.config.vocab_size, self.device)
        return self.choice_program

    @property
    def device(self) -> torch.device:
        return self.model.device

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        for event in self.stream(prompt_ids, params):
            if isinstance(event, GenerationDone):
                return event.result
        raise AssertionError("stream() ended without a GenerationDone event")

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams) -> Iterator[StreamEvent]:
        """Events of one call; validation errors are raised before the first event."""
        return self.run(DecodeCall(self, list(prompt_ids), params))

    def run(self, call: DecodeCall) -> Iterator[StreamEvent]:
        """Events of ``call`` (made on this decoder) under its mode's loop."""
        loop = {"diffusion": diffusion, "self_speculative": self_speculative}.get(
            call.params.mode, autoregressive
        )
        return loop(call)

    def tools_part_marker(self) -> list[int]:
        """:data:`TOOLS_PART_END` as token ids ([] without a tokenizer)."""
        if self._tools_marker is None:
            self._tools_marker = self.tokenizer.encode(TOOLS_PART_END) if self.tokenizer is not None else []
        return self._tools_marker

    def stop_token_ids(self, params: SamplingParams) -> set[int]:
        if params.ignore_eos:
            return set(params.stop_token_ids)
        stops = set(self.config.eos_token_id) | set(params.stop_token_ids)
        if self.tokenizer is not None and self.tokenizer.im_end_id is not None:
            stops.add(self.tokenizer.im_end_id)
        return stops

    def control_tokens(self, params: SamplingParams) -> ControlTokens:
        think_end = params.think_end_token_id
        if think_end is None and self.tokenizer is not None:
            think_end = self.tokenizer.maybe_token_id("</think>")
        response_end = self.tokenizer.im_end_id if self.tokenizer is not None else None
        if response_end is None:
            ordered = list(params.stop_token_ids) + list(self.config.eos_token_id)
            response_end = ordered[0] if ordered else None
        return ControlTokens(think_end=think_end, response_end=response_end)


class DecodeCall:
    """One call: validation, state and counters, and the pieces the modes share."""

    def __init__(self, decoder: BlockDecoder, prompt: list[int], params: SamplingParams) -> None:
        config = decoder.config
        self.decoder, self.model, self.config, self.params = decoder, decoder.model, config, params
        self.prompt = prompt
        if not prompt:
            raise ValueError("the prompt is empty: generation needs at least one prompt token")
        bad = [t for t in prompt if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {config.vocab_size}): {bad[:5]}")
        named = {"stop_token_ids": list(params.stop_token_ids)}
        if params.think_end_token_id is not None:
            named["think_end_token_id"] = [params.think_end_token_id]
        for name, ids in named.items():
            bad = [t for t in ids if not 0 <= t < config.vocab_size]
            if bad:
                raise ValueError(f"{name} outside the vocabulary [0, {config.vocab_size}): {bad[:5]}")
        if len(prompt) >= config.max_position_embeddings:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the context window is "
                f"{config.max_position_embeddings} (leave room for at least one generated token)"
            )
        if params.block_size != config.block_size:
            raise ValueError(
                f"block_size {params.block_size} differs from the checkpoint's block_size "
                f"{config.block_size} (build the parameters with SamplingParams.for_model(config) or "
                "Engine.default_params() to use the checkpoint's values)"
            )
        if params.mode != "autoregressive" and config.mask_token_id is None:
            raise ValueError(
                f"mode {params.mode!r} needs a mask token but the checkpoint's config.json has no "
                "mask_token_id (use mode='autoregressive' for a plain causal checkpoint)"
            )
        self.started = time.perf_counter()
        self.block_size = config.block_size
        self.threshold = params.threshold
        self.mask = config.mask_token_id
        self.stops = decoder.stop_token_ids(params)
        self.controls = LogitsControls(
            params, decoder.control_tokens(params), config.vocab_size, decoder.device
        )
        self.generator: torch.Generator | None = None
        if not params.greedy_draws:
            self.generator = torch.Generator(device=decoder.device)
            self.generator.manual_seed(params.seed if params.seed is not None else 0)
        # Tokens the call may still produce: the request, capped by the context window.
        self.limit = min(params.max_new_tokens, config.max_position_embeddings - len(prompt))
        self.generated: list[int] = []
        self.forwards = 0
        self.steps_per_block: list[int] = []
        self.fallback_steps = 0
        self.reused = 0
        self.commits_before = 0
        self._share_points: list[int] | None = None
        self.text = ""  # text of generated[text_offset:] already streamed
        self.text_offset = 0
        self.chunks_seen = 0
        self.graphs: StepGraphs | None = None
        #: Denoising passes captured with their token choice (graphs, the fused step, diffusion).
        self.program: ChoiceProgram | None = None
        self.fused: FusedChoice | None = None
        if decoder.choice != "torch" and (decoder.choice == "triton" or decoder.device.type == "cuda"):
            problem = fused_choice_problem(params, decoder.device)
            if problem is None:
                self.fused = FusedChoice(params, config.mask_token_id, decoder.device)
            elif decoder.choice == "triton":
                raise ValueError(f"choice='triton' cannot run: {problem}")

    # ---- model passes ------------------------------------------------------------------------
    def forward(
        self,
        tokens: Sequence[int],
        cache: ModelCache,
        attention: AttentionRule,
        commit: bool | int = False,
        *,
        logit_rows: int | None = None,
        causal_prefix: int = 0,
    ) -> torch.Tensor:
        self._count_forward()
        ids = upload(list(tokens), self.decoder.device)
        if self.graphs is not None and len(ids) in (1, self.block_size, 2 * self.block_size):
            count, rows = len(ids), len(ids) if logit_rows is None else logit_rows
            # Few shapes: no logits, a block's, or every row's (sliced here).
            shape = StepShape(
                count,
                attention,
                count if commit is True else int(commit),
                causal_prefix,
                rows if rows in (0, self.block_size) else count,
            )
            if self.graphs.fits(shape):
                out = self.graphs(ids, shape)
                if out is not None:
                    return out[shape.logit_rows - rows :]
        return self.model(
            ids, cache, attention=attention, commit=commit, logit_rows=logit_rows, causal_prefix=causal_prefix
        )

    def _count_forward(self) -> None:
        self._claim()
        self.forwards += 1

    def _claim(self) -> None:
        """Stop a call overtaken by a later one on the same workspace before it touches the device."""
        if self.decoder.keep_workspace and self.decoder.current is not self:
            raise RuntimeError(
                "another call started on this decoder since this one: its state is gone (finish or "
                "drop a stream before the next call)"
            )

    def denoise_pass(
        self,
        prefix: list[int],
        tokens: list[int],
        decided: list[bool],
        cache: ModelCache,
        *,
        commit: int = 0,
        causal_prefix: int = 0,
    ) -> bool:
        """A denoising pass over the block ``tokens`` after ``prefix`` (committed with it when
        ``commit``): the forward, then :meth:`denoise`; with CUDA graphs and the fused choice, both
        as one captured program (``fused_choice.ChoiceProgram``) for a whole block after nothing or
        after one block. Returns whether LowConfidence fell back to one slot."""
        program, graphs, fused, block = self.program, self.graphs, self.fused, self.block_size
        if (
            program is not None
            and graphs is not None
            and graphs.cache is cache
            and fused is not None
            and len(tokens) == block
            and len(prefix) in (0, block)
        ):
            shape = StepShape(len(prefix) + block, "block", commit, causal_prefix, block)
            variant = program.variant(self, fused, self.threshold)
            key = (shape, variant)
            if graphs.fits(shape, key):
                self._claim()
                base = len(self.generated)
                program.stage(self, variant, [base + i for i in range(block)], tokens, decided)
                outs = graphs.run(
                    key,
                    shape,
                    lambda: program.body(graphs, shape, variant),
                    prefix=prefix,
                    state=program.state,
                )
                if outs is not None:
                    self.forwards += 1
                    return read_pass(outs[0], tokens, decided)
        logits = self.forward(
            prefix + tokens,
            cache,
            "block",
            commit=commit or False,
            causal_prefix=causal_prefix,
            logit_rows=len(tokens),
        )
        return self.denoise(logits, tokens, decided)

    def start_cache(self, attention: AttentionRule, max_length: int, multiple_of: int) -> ModelCache:
        """The longest reusable snapshot (or an empty cache) with K/V room for the whole call."""
        capacity = len(self.prompt) + self.limit + 2 * self.block_size
        decoder = self.decoder
        prefix = decoder.prefix_cache
        into = decoder.workspace_for(capacity) if decoder.keep_workspace else None
        if into is not None:
            decoder.current = self
        cache = None
        if prefix is not None and max_length > 0:
            cache = prefix.lookup(
                self.prompt,
                attention,
                max_length=max_length,
                multiple_of=multiple_of,
                capacity=capacity,
                into=into,
            )
        if cache is None and into is not None:
            into.load(None)
            cache = into
        if cache is None:
            cache = self.model.new_cache(capacity)
        self.graphs = decoder.step_graphs  # None without CUDA graphs
        if self.graphs is not None and self.fused is not None and self.params.mode == "diffusion":
            self.program = decoder.program()
            self.program.start(self.fused)
        self.reused = cache.length
        self.commits_before = cache.commits
        return cache

    def prefill(self, cache: ModelCache, end: int, attention: AttentionRule) -> None:
        """Commit prompt[cache.length:end] in whole-block chunks (no logits); keep a snapshot, and one
        at each :meth:`share_points` point on the way (the chunks stop there whether or not it is
        kept, so a call computes the same with a shared state as without)."""
        if cache.length >= end:
            return
        chunk = max(self.block_size, self.decoder.prefill_chunk // self.block_size * self.block_size)
        points = [p for p in self.share_points() if p < end]
        while cache.length < end:
            stop = min([end, cache.length + chunk, *(p for p in points if p > cache.length)])
            self.forward(self.prompt[cache.length : stop], cache, attention, commit=True, logit_rows=0)
            if cache.length in points:
                self.remember(cache, attention, self.prompt[: cache.length])
        self.remember(cache, attention, self.prompt[:end])

    def share_points(self) -> list[int]:
        """Where other conversations are likely to share this prompt, in whole blocks, ascending:
        the end of the tools' part of a chat prompt's first message (:data:`TOOLS_PART_END`: the
        same for every agent of one product, whatever its repository), and the end of that first
        message (the system prompt too: the same for every conversation of one agent in one place).
        Empty for a prompt that is not a chat. ``BatchEngine`` holds back requests whose first point
        another is still computing."""
        if self._share_points is None:
            self._share_points = self._find_share_points()
        return self._share_points

    def _find_share_points(self) -> list[int]:
        tokenizer = self.decoder.tokenizer
        if tokenizer is None or tokenizer.im_end_id is None or self.prompt[0] != tokenizer.im_start_id:
            return []
        try:
            first = self.prompt.index(tokenizer.im_end_id) + 1
        except ValueError:
            return []
        ends = [first]
        marker = self.decoder.tools_part_marker()
        if marker:
            found = _last_occurrence(self.prompt[:first], marker)
            if found >= 0:
                ends.append(found + len(marker))
        size = self.block_size
        return sorted({n // size * size for n in ends} - {0})

    def remember(self, cache: ModelCache, attention: AttentionRule, tokens: Sequence[int]) -> None:
        """Store a compact copy of the committed state for later calls."""
        prefix = self.decoder.prefix_cache
        if prefix is not None and cache.length > self.reused:
            prefix.store(tokens, attention, cache.clone())

    # ---- token choice ------------------------------------------------------------------------
    def choose(
        self, logits: torch.Tensor, positions: Sequence[int], decided: Sequence[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and confidences (on the device) of controlled rows for generated ``positions``."""
        controlled = self.controls.apply(logits, positions, decided)
        return choose_tokens(controlled, self.params, self.mask, self.generator)

    def denoise(
        self, logits: torch.Tensor, tokens: list[int], decided: list[bool], *, fill_all: bool = False
    ) -> bool:
        """One denoising pass over a block (``logits`` [len(tokens), V]), in place: choose a token for
        every open slot and fill the confident ones (LowConfidence), or all of them with ``fill_all``.
        Returns whether LowConfidence fell back to the single most confident slot. The pass's one
        read-back from the device is here."""
        if self.program is not None:
            self.program.staged = None  # this pass changes the block outside the program's buffers
        if self.fused is not None:
            return self.fused.denoise(self, logits, tokens, decided, fill_all)
        open_slots = [i for i, done in enumerate(decided) if not done]
        base = len(self.generated)
        rows = (
            logits
            if len(open_slots) == len(tokens)
            else logits.index_select(0, upload(open_slots, logits.device))
        )
        chosen, confidence = self.choose(
            rows,
            [base + i for i in open_slots],
            [(base + i, token) for i, (token, done) in enumerate(zip(tokens, decided, strict=True)) if done],
        )
        count = len(open_slots)
        if fill_all:
            values = chosen.tolist()
            fill, fallback = [True] * count, False
        else:
            fill_mask, fallback_flag = low_confidence_fill(confidence, self.threshold)
            values = torch.cat([chosen, fill_mask.long(), fallback_flag.long().view(1)]).tolist()
            fill, fallback = [bool(v) for v in values[count:-1]], bool(values[-1])
        for slot, token, take in zip(open_slots, values[:count], fill, strict=True):
            if take:
                tokens[slot] = token
                decided[slot] = True
        return fallback

    # ---- output ------------------------------------------------------------------------------
    def emit(self, block: int, tokens: list[int]) -> BlockCommitted:
        """Append final tokens to the output and build their event (with their text)."""
        self.generated.extend(tokens)
        self.controls.observe(tokens)
        text = None
        tokenizer = self.decoder.tokenizer
        if tokenizer is not None:
            # Decode only since the last clean boundary (the output may be long); an incomplete
            # UTF-8 sequence at the end waits for the tokens that complete it.
            full = tokenizer.decode(self.generated[self.text_offset :])
            stable = full.rstrip("\ufffd")
            text = stable[len(self.text) :] if stable.startswith(self.text) else stable
            self.text = stable
            if stable == full:
                self.text_offset, self.text = len(self.generated), ""
        return BlockCommitted(block=block, token_ids=tokens, text=text)

    def first_stop(self, tokens: Sequence[int]) -> int | None:
        for i, token in enumerate(tokens):
            if token in self.stops:
                return i
        return None

    def finish(self, reason: FinishReason, cache: ModelCache, attention: AttentionRule) -> GenerationDone:
        """The GenerationDone event; hands the final committed state to the prefix cache first (a
        consumer may stop iterating at GenerationDone)."""
        # An overtaken call's last pass may be behind it, but the workspace holds the later call's
        # state now: storing it under this call's tokens would poison the prefix cache.
        self._claim()
        commits = cache.commits - self.commits_before
        self.remember(cache, attention, (self.prompt + self.generated)[: cache.length])
        return GenerationDone(self.result(reason, commits))

    def result(self, reason: FinishReason, commits: int = 0) -> GenerationResult:
        """The call's result as it stands: the tokens committed so far and the counters."""
        tokenizer = self.decoder.tokenizer
        return GenerationResult(
            token_ids=list(self.generated),
            finish_reason=reason,
            forwards=self.forwards,
            steps_per_block=list(self.steps_per_block),
            fallback_steps=self.fallback_steps,
            seconds=time.perf_counter() - self.started,
            prompt_tokens=len(self.prompt),
            reused_tokens=self.reused,
            commits=commits,
            mode=self.params.mode,
            text=tokenizer.decode(self.generated) if tokenizer is not None else None,
        )

    def causal_done(self, cache: ModelCache) -> GenerationDone | None:
        """After a causal mode's emit: the GenerationDone event when the output reached its limit, or
        repeats itself and ``loop_action`` is ``stop``; None to go on."""
        if len(self.generated) >= self.limit:
            return self.finish("length", cache, "causal")
        if self._observe_chunks() and self.params.loop_action == "stop":
            return self.finish("loop", cache, "causal")
        return None

    def _observe_chunks(self) -> bool:
        """Loop detection over whole ``block_size`` chunks of the output (causal modes)."""
        size = self.block_size
        repeated = False
        while self.chunks_seen < len(self.generated) // size:
            start = self.chunks_seen * size
            repeated |= self.controls.observe_block(self.generated[start : start + size])
            self.chunks_seen += 1
        return repeated


def _last_occurrence(tokens: list[int], marker: list[int]) -> int:
    """Where the last occurrence of ``marker`` starts in ``tokens`` (-1: none)."""
    n = len(marker)
    for start in range(len(tokens) - n, -1, -1):
        if tokens[start] == marker[0] and tokens[start : start + n] == marker:
            return start
    return -1
