"""The decoding contract (``DESIGN.md``): block diffusion with LowConfidence, plus the
self-speculative and autoregressive modes, as one generator of stream events.

Diffusion (default). Blocks are aligned to absolute positions (multiples of ``block_size`` from 0).
Whole prompt blocks are prefilled with one committing block-attention forward; the prompt's partial
last block shares the first generation block, its prompt positions fixed. Each block starts with
every generated position masked. A denoising pass (``attention="block"``, ``commit=False``) gives
logits for the block; the controls adjust the rows of the masked positions; LowConfidence fills
every masked position whose confidence is strictly above the threshold, or, when none is, the
single most confident one (ties: lowest index). The mask token is never emitted (its logit is -inf
before confidence). When the block is full, one commit pass writes its K/V, GDN state and conv tail.
The call ends

* at the first stop token, excluded from the output, as soon as it and every position before it are
  decided (no commit pass: nothing follows);
* at ``max_new_tokens`` (or the context window): the last block is decoded whole, every position
  masked as in training, and the output trimmed; it ends as soon as every position within the
  limit is decided, since decided tokens never change;
* after a repeated block when ``loop_action="stop"``.

Self-speculative. The committed context is causal, so the output equals greedy autoregressive
decoding. The cache always ends on a block boundary A; the accepted tokens after it are *pending*
(re-fed to every verify pass). A round drafts the positions up to the end of the current block (the
whole next block when the pending tokens fill theirs) with the diffusion forward
(``attention="block"`` over pending + masks on top of the causal cache), then verifies with ONE
causal pass over pending + draft: it accepts the longest draft prefix equal to what the causal
logits choose, plus the causal choice at the first disagreement (or after the draft). The verify
pass commits (``commit=n``) only whole blocks of tokens accepted in earlier rounds, so state
advances over accepted tokens only and never twice.

Autoregressive. One causal forward per token, each committing its input token.

Sampling (``temperature > 0``): a position's token is drawn from its controlled, temperature-scaled,
top-k / top-p filtered distribution; its commit confidence is the probability of the drawn token
under that renormalised distribution. Draws use a ``torch.Generator`` on the model's device seeded
with ``seed`` (0 when None). In the speculative verify, the causal "choice" at a row is a draw from
the causal distribution, so the output is distributed exactly as autoregressive sampling.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence

import torch

from clover_agent.engine.cache import ModelCache
from clover_agent.engine.config import CloverConfig
from clover_agent.engine.controls import ControlTokens, LogitsControls
from clover_agent.engine.model import CloverModel
from clover_agent.engine.prefix_cache import PrefixCache
from clover_agent.engine.sampling import FinishReason, GenerationResult, SamplingParams
from clover_agent.engine.stream import BlockCommitted, BlockProgress, GenerationDone, StreamEvent
from clover_agent.engine.tokenizer import Tokenizer

#: Prefill runs in chunks of at most this many tokens (rounded down to whole blocks).
PREFILL_CHUNK_TOKENS = 4096


# ---- LowConfidence (pure tensor code) --------------------------------------------------------
def choose_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    mask_token_id: int | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and commit confidence [n] for each row of controlled ``logits`` [n, V].

    Greedy: the argmax and its softmax probability. Sampling: a draw from the filtered distribution
    and its probability there. The mask token's logit is -inf first, so it is never chosen."""
    logits = logits.float().clone()
    if mask_token_id is not None:
        logits[:, mask_token_id] = float("-inf")
    if params.greedy_draws:
        confidence, tokens = torch.softmax(logits, dim=-1).max(dim=-1)
        return tokens, confidence
    probs = torch.softmax(_filtered(logits / params.temperature, params), dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, probs.gather(1, tokens[:, None]).squeeze(1)


def _filtered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Top-k then top-p (nucleus: the smallest set of most likely tokens whose mass reaches top_p)."""
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def low_confidence_fill(confidence: torch.Tensor, threshold: float) -> tuple[torch.Tensor, bool]:
    """Which of the candidate positions (confidence [n]) to fill, and whether this was a fallback.

    Every position strictly above ``threshold``; if none, the single most confident one, the lowest
    index among ties."""
    above = confidence > threshold
    if bool(above.any()):
        return above, False
    best = int(torch.nonzero(confidence == confidence.max())[0, 0])
    fill = torch.zeros_like(above)
    fill[best] = True
    return fill, True


# ---- the decoder -----------------------------------------------------------------------------
class BlockDecoder:
    """Runs generation calls on one model; keeps the prefix cache between calls."""

    def __init__(
        self,
        model: CloverModel,
        tokenizer: Tokenizer | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.config: CloverConfig = model.config
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        for event in self.stream(prompt_ids, params):
            if isinstance(event, GenerationDone):
                return event.result
        raise AssertionError("stream() ended without a GenerationDone event")

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams) -> Iterator[StreamEvent]:
        """Events of one call; validation errors are raised before the first event."""
        run = _Run(self, list(prompt_ids), params)
        return run.events()

    def stop_token_ids(self, params: SamplingParams) -> set[int]:
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


class _Run:
    """One call: validation, state and counters, and the mode's loop."""

    def __init__(self, decoder: BlockDecoder, prompt: list[int], params: SamplingParams) -> None:
        config = decoder.config
        self.decoder, self.model, self.config, self.params = decoder, decoder.model, config, params
        self.prompt = prompt
        if not prompt:
            raise ValueError("the prompt is empty: generation needs at least one prompt token")
        bad = [t for t in prompt if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {config.vocab_size}): {bad[:5]}")
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
        self.text = ""  # text of generated[text_offset:] already streamed
        self.text_offset = 0
        self.chunks_seen = 0

    # ---- shared pieces -----------------------------------------------------------------------
    def forward(self, tokens: Sequence[int], cache: ModelCache, attention: str, commit: bool | int = False):
        self.forwards += 1
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.decoder.device)
        return self.model(ids, cache, attention=attention, commit=commit)

    def start_cache(self, attention: str, max_length: int, multiple_of: int) -> ModelCache:
        prefix = self.decoder.prefix_cache
        cache = None
        if prefix is not None and max_length > 0:
            cache = prefix.lookup(self.prompt, attention, max_length=max_length, multiple_of=multiple_of)
        if cache is None:
            cache = self.model.new_cache()
        self.reused = cache.length
        self.commits_before = cache.commits
        return cache

    def prefill(self, cache: ModelCache, end: int, attention: str) -> None:
        """Commit prompt[cache.length:end] in whole-block chunks; keep a snapshot for later calls."""
        if cache.length >= end:
            return
        chunk = max(self.block_size, PREFILL_CHUNK_TOKENS // self.block_size * self.block_size)
        while cache.length < end:
            stop = min(end, cache.length + chunk)
            self.forward(self.prompt[cache.length : stop], cache, attention, commit=True)
        self.remember(cache, attention, self.prompt[:end], copy=True)

    def remember(self, cache: ModelCache, attention: str, tokens: Sequence[int], *, copy: bool) -> None:
        prefix = self.decoder.prefix_cache
        if prefix is not None and cache.length > self.reused:
            prefix.store(tokens, attention, cache.clone() if copy else cache)

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

    def finish(
        self, reason: FinishReason, cache: ModelCache, started: float, attention: str
    ) -> GenerationDone:
        """The GenerationDone event; hands the final committed state to the prefix cache first (a consumer may
        stop iterating at GenerationDone)."""
        commits = cache.commits - self.commits_before
        self.remember(cache, attention, (self.prompt + self.generated)[: cache.length], copy=False)
        tokenizer = self.decoder.tokenizer
        result = GenerationResult(
            token_ids=list(self.generated),
            finish_reason=reason,
            forwards=self.forwards,
            steps_per_block=list(self.steps_per_block),
            fallback_steps=self.fallback_steps,
            seconds=time.perf_counter() - started,
            prompt_tokens=len(self.prompt),
            reused_tokens=self.reused,
            commits=commits,
            mode=self.params.mode,
            text=tokenizer.decode(self.generated) if tokenizer is not None else None,
        )
        return GenerationDone(result)

    def events(self) -> Iterator[StreamEvent]:
        mode = self.params.mode
        if mode == "diffusion":
            return self.diffusion()
        if mode == "self_speculative":
            return self.self_speculative()
        return self.autoregressive()

    def choose(self, logits: torch.Tensor, positions: Sequence[int], decided: Sequence[tuple[int, int]]):
        controlled = self.controls.apply(logits, positions, decided)
        return choose_tokens(controlled, self.params, self.mask, self.generator)

    # ---- diffusion ---------------------------------------------------------------------------
    def diffusion(self) -> Iterator[StreamEvent]:
        started = time.perf_counter()
        size = self.block_size
        aligned = len(self.prompt) // size * size
        cache = self.start_cache("block", aligned, size)
        self.prefill(cache, aligned, "block")
        block = 0
        while True:
            fixed = self.prompt[cache.length :] if block == 0 else []
            slots = size - len(fixed)
            remaining = self.limit - len(self.generated)
            tokens = [self.mask] * slots
            decided = [False] * slots
            steps = 0
            finish: tuple[FinishReason, int] | None = None
            while not all(decided):
                logits = self.forward(fixed + tokens, cache, "block")[len(fixed) :]
                steps += 1
                self.fallback_steps += self._denoise(logits, tokens, decided)
                yield BlockProgress(block, cache.length + len(fixed), steps, list(tokens), list(decided))
                finish = self._diffusion_finish(tokens, decided, remaining)
                if finish is not None:
                    break
            self.steps_per_block.append(steps)
            if finish is not None:
                reason, keep = finish
                yield self.emit(block, tokens[:keep])
                yield self.finish(reason, cache, started, "block")
                return
            self.forward(fixed + tokens, cache, "block", commit=True)
            yield self.emit(block, tokens)
            if self.controls.observe_block(tokens) and self.params.loop_action == "stop":
                yield self.finish("loop", cache, started, "block")
                return
            block += 1

    def _denoise(
        self, logits: torch.Tensor, tokens: list[int], decided: list[bool], *, fill_all: bool = False
    ) -> bool:
        """One denoising pass over a block (``logits`` [len(tokens), V]), in place: choose a token for
        every open slot and fill the confident ones (LowConfidence), or all of them with ``fill_all``.
        Returns whether LowConfidence fell back to the single most confident slot."""
        open_slots = [i for i, done in enumerate(decided) if not done]
        base = len(self.generated)
        chosen, confidence = self.choose(
            logits[open_slots],
            [base + i for i in open_slots],
            [(base + i, token) for i, (token, done) in enumerate(zip(tokens, decided, strict=True)) if done],
        )
        if fill_all:
            fill, fallback = torch.ones_like(confidence, dtype=torch.bool), False
        else:
            fill, fallback = low_confidence_fill(confidence, self.threshold)
        for slot, token, take in zip(open_slots, chosen.tolist(), fill.tolist(), strict=True):
            if take:
                tokens[slot] = token
                decided[slot] = True
        return fallback

    def _diffusion_finish(
        self, tokens: list[int], decided: list[bool], remaining: int
    ) -> tuple[FinishReason, int] | None:
        """(reason, tokens to keep) once the decided prefix of the block settles the call."""
        for i in range(min(remaining, len(tokens))):
            if not decided[i]:
                return None
            if tokens[i] in self.stops:
                return "stop", i
        return ("length", remaining) if remaining <= len(tokens) else None

    # ---- self-speculative --------------------------------------------------------------------
    def self_speculative(self) -> Iterator[StreamEvent]:
        started = time.perf_counter()
        size = self.block_size
        # At least one prompt token stays pending: its causal logits give the first new token.
        aligned = (len(self.prompt) - 1) // size * size
        cache = self.start_cache("causal", aligned, size)
        self.prefill(cache, aligned, "causal")
        pending = self.prompt[cache.length :]  # always ends at the last known token
        block = 0
        while True:
            committable = len(pending) // size * size
            draft, draft_passes = yield from self._draft(block, cache, pending, size - len(pending) % size)
            logits = self.forward(pending + draft, cache, "causal", commit=committable or False)
            accepted = self._verify(logits[len(pending) - 1 :], draft)
            pending = pending[committable:] + accepted
            self.steps_per_block.append(draft_passes + 1)
            room = self.limit - len(self.generated)
            stop = self.first_stop(accepted)
            if stop is not None and stop < room:
                yield self.emit(block, accepted[:stop])
                yield self.finish("stop", cache, started, "causal")
                return
            yield self.emit(block, accepted[:room])
            if (done := self._causal_done(cache, started)) is not None:
                yield done
                return
            block += 1

    def _draft(
        self, block: int, cache: ModelCache, pending: list[int], length: int
    ) -> Generator[StreamEvent, None, tuple[list[int], int]]:
        """Draft ``length`` tokens after ``pending`` by diffusion on top of the causal cache: LowConfidence
        for ``draft_steps - 1`` passes, then every remaining mask from the last pass. Returns the draft and
        the number of passes it took."""
        tokens = [self.mask] * length
        decided = [False] * length
        for step in range(self.params.draft_steps):
            logits = self.forward(pending + tokens, cache, "block")[len(pending) :]
            self._denoise(logits, tokens, decided, fill_all=step == self.params.draft_steps - 1)
            yield BlockProgress(block, cache.length + len(pending), step + 1, list(tokens), list(decided))
            if all(decided):
                break
        return tokens, step + 1

    def _verify(self, rows: torch.Tensor, draft: list[int]) -> list[int]:
        """The accepted draft prefix plus the causal choice after it; ``rows[j]`` predicts ``draft[j]``."""
        base = len(self.generated)
        if not self.controls.active and self.params.greedy_draws:
            targets = choose_tokens(rows, self.params, self.mask, None)[0].tolist()
        else:
            targets = None
        accepted: list[int] = []
        for j in range(len(draft) + 1):
            if targets is not None:
                target = targets[j]
            else:  # controls see the draft tokens before the row as generated
                decided = [(base + i, draft[i]) for i in range(j)]
                target = int(self.choose(rows[j : j + 1], [base + j], decided)[0][0])
            accepted.append(target)
            if j == len(draft) or draft[j] != target:
                break
        return accepted

    def _causal_done(self, cache: ModelCache, started: float) -> GenerationDone | None:
        """After a causal emit: the GenerationDone event when the output reached its limit, or repeats itself
        and ``loop_action`` is ``stop``; None to go on."""
        if len(self.generated) >= self.limit:
            return self.finish("length", cache, started, "causal")
        if self._observe_chunks() and self.params.loop_action == "stop":
            return self.finish("loop", cache, started, "causal")
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

    # ---- autoregressive ----------------------------------------------------------------------
    def autoregressive(self) -> Iterator[StreamEvent]:
        started = time.perf_counter()
        size = self.block_size
        cache = self.start_cache("causal", len(self.prompt) - 1, 1)
        self.prefill(cache, (len(self.prompt) - 1) // size * size, "causal")
        logits = self.forward(self.prompt[cache.length :], cache, "causal", commit=True)[-1:]
        while True:
            token = int(self.choose(logits, [len(self.generated)], [])[0][0])
            self.steps_per_block.append(1)
            if token in self.stops:
                yield self.finish("stop", cache, started, "causal")
                return
            yield self.emit(len(self.generated) // size, [token])
            if (done := self._causal_done(cache, started)) is not None:
                yield done
                return
            logits = self.forward([token], cache, "causal", commit=True)
