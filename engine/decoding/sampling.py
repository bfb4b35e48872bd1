"""What one generation call asks for (:class:`SamplingParams`) and what it returns
(:class:`GenerationResult`).

Defaults are the bare decoding contract (docs/decoding.md): blocks of 32, LowConfidence at 0.95,
greedy, no penalties, no thinking or end-of-response controls, no loop action. Every control is
off until a field turns it on, so ``SamplingParams(max_new_tokens=n)`` decodes exactly as the
contract says. A checkpoint may override the contract's block size and threshold in its
``config.json``: :meth:`SamplingParams.for_model` (and ``Engine.default_params``) build parameters
with the checkpoint's values, which is what every caller without explicit values uses.
``SamplingParams.coding()`` is the recommended setting for agent work (Qwen's thinking-mode coding
settings); ``SamplingParams.greedy()`` is the same with greedy draws; both take ``config=`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from clover_agent.engine.model.config import CloverConfig

Mode = Literal["diffusion", "self_speculative", "autoregressive"]
MODES: tuple[str, ...] = ("diffusion", "self_speculative", "autoregressive")
LoopAction = Literal["none", "penalize", "stop"]
LOOP_ACTIONS: tuple[str, ...] = ("none", "penalize", "stop")
FinishReason = Literal["stop", "length", "loop"]
ConfidenceRule = Literal["probability", "sglang"]
#: Sampling's commit confidence rules (the same names and numbers as the kernels' ``TokenChoice``).
CONFIDENCE_RULES: tuple[str, ...] = ("probability", "sglang")
#: Earlier names of those rules, still accepted: ``SamplingParams`` stores the current name.
CONFIDENCE_ALIASES: dict[str, str] = {"drawn": "probability", "relative": "sglang"}


@dataclass(frozen=True)
class SamplingParams:
    """Parameters of one ``Engine.generate`` / ``Engine.stream`` call; ``docs/decoding.md`` describes
    each field.

    ``block_size`` and ``threshold`` default to the contract's 32 and 0.95; :meth:`for_model` takes
    them from a checkpoint's config instead. ``block_size`` must equal the checkpoint's (blocks are
    aligned to absolute positions the model was trained with; a call with another one is a
    ValueError); it is a field so a caller states what it expects.

    Sampling: ``temperature=0`` is greedy (the commit confidence of a position is the top-1
    probability of its controlled logits). With ``temperature>0`` each masked position draws a token
    from its controlled, temperature-scaled, top-k / top-p filtered distribution; draws come from a
    ``torch.Generator`` seeded with ``seed`` (0 when None), so equal parameters give equal outputs on
    the same device.

    ``confidence``: what LowConfidence compares with the threshold when sampling. ``"probability"``
    (the default): the drawn token's probability under that filtered, renormalised distribution;
    ``"sglang"``: SGLang's rule, see ``choice.py``. The earlier names ``"drawn"`` and ``"relative"``
    are accepted and stored as these.

    Controls (see ``controls.py``) act on the logits of every masked position before temperature and
    confidence, each only in its phase; at their defaults every control is off and decoding is the bare
    contract:

    - penalties: over the generated tokens (committed plus already decided in the current block; never
      the prompt);
    - the thinking controls (when ``thinking``): before ``</think>``; the end-of-response ramp (when
      ``end_bias_start`` is set): after it;
    - loop handling (``loop_action``): after a repeated block.
    """

    max_new_tokens: int = 256
    block_size: int = 32
    threshold: float = 0.95
    temperature: float = 0.0
    top_p: float = 1.0  # 1: no nucleus filter
    top_k: int = 0  # 0: no top-k filter
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Thinking: the prompt opened a <think> section (chat template enable_thinking=True).
    thinking: bool = False
    # </think> is forced at this generated position (0-based) unless written earlier: at most
    # thinking_budget thinking tokens. None: no budget (still at most one </think>).
    thinking_budget: int | None = None
    thinking_ramp_start: float = 0.75  # fraction of the budget where the </think> bias starts
    thinking_ramp_strength: float = 8.0  # logit bias on </think> reached at the budget
    think_end_token_id: int | None = None  # None: the tokenizer's </think>
    # End of response, in the answer phase only (after </think>, or everywhere without thinking): a
    # bias towards the end token (<|im_end|>, else the first stop id) that grows from position
    # end_bias_start * max_new_tokens to end_bias_strength at the last allowed token. None: off.
    end_bias_start: float | None = None
    end_bias_strength: float = 8.0
    stop_token_ids: tuple[int, ...] = ()  # added to the config's eos ids and <|im_end|>
    # The config's eos ids and <|im_end|> do not stop the call (only stop_token_ids do): answers of a
    # fixed length, for benchmarks (vLLM's and SGLang's ignore_eos).
    ignore_eos: bool = False
    mode: Mode = "diffusion"
    seed: int | None = None  # seed of the sampling draws; None: 0
    # Loop detection: a finished block whose generated tokens repeat an earlier block of the call.
    loop_action: LoopAction = "none"
    loop_penalty: float = 1.3  # "penalize": the repetition penalty is multiplied by this per repeat
    # self_speculative: denoising passes per draft (1: every mask filled from one diffusion pass).
    draft_steps: int = 1
    # Sampling's commit confidence: "probability" (the drawn token's probability under the filtered
    # distribution) or "sglang" (SGLang's min(argmax probability at T=1, exp((z_drawn - z_max) / T)));
    # aliases "drawn" and "relative".
    confidence: ConfidenceRule = "probability"
    # diffusion: encode the committed context causally (prefill and commit passes causal; denoising
    # passes still see their own block whole) instead of block-causally.
    causal_context: bool = False
    # diffusion: run each block's commit inside the next block's first denoising pass (one forward
    # over both blocks) instead of a pass of its own; same tokens, one forward less per block.
    fuse_commit: bool = False

    def __post_init__(self) -> None:
        if self.confidence in CONFIDENCE_ALIASES:
            object.__setattr__(self, "confidence", CONFIDENCE_ALIASES[self.confidence])
        problems = self.problems()
        if problems:
            raise ValueError("invalid sampling parameters: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every inconsistency, each saying what is wrong and what is allowed."""
        out: list[str] = []
        if self.max_new_tokens < 1:
            out.append(f"max_new_tokens must be at least 1 (got {self.max_new_tokens})")
        if self.block_size < 1:
            out.append(f"block_size must be positive (got {self.block_size})")
        if not 0.0 < self.threshold <= 1.0:
            out.append(f"threshold must be in (0, 1] (got {self.threshold})")
        if not self.temperature >= 0.0 or math.isinf(self.temperature):
            out.append(f"temperature must be a finite number >= 0 (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            out.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            out.append(f"top_k must be >= 0, 0 meaning no limit (got {self.top_k})")
        if not self.repetition_penalty > 0.0 or math.isinf(self.repetition_penalty):
            out.append(
                f"repetition_penalty must be a finite number > 0, 1 meaning off (got {self.repetition_penalty})"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not value >= 0.0 or math.isinf(value):
                out.append(f"{name} must be a finite number >= 0 (got {value})")
        if self.thinking_budget is not None and self.thinking_budget < 1:
            out.append(f"thinking_budget must be at least 1 (got {self.thinking_budget})")
        if self.thinking_budget is not None and not self.thinking:
            out.append("thinking_budget needs thinking=True (the prompt must open a <think> section)")
        if not 0.0 <= self.thinking_ramp_start <= 1.0:
            out.append(f"thinking_ramp_start must be in [0, 1] (got {self.thinking_ramp_start})")
        if not self.thinking_ramp_strength >= 0.0:
            out.append(f"thinking_ramp_strength must be >= 0 (got {self.thinking_ramp_strength})")
        if self.end_bias_start is not None and not 0.0 <= self.end_bias_start <= 1.0:
            out.append(f"end_bias_start must be in [0, 1] (got {self.end_bias_start})")
        if not self.end_bias_strength >= 0.0:
            out.append(f"end_bias_strength must be >= 0 (got {self.end_bias_strength})")
        if any(t < 0 for t in self.stop_token_ids):
            out.append(f"stop_token_ids must be token ids >= 0 (got {list(self.stop_token_ids)})")
        if self.mode not in MODES:
            out.append(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.loop_action not in LOOP_ACTIONS:
            out.append(f"loop_action must be one of {', '.join(LOOP_ACTIONS)} (got {self.loop_action!r})")
        if not self.loop_penalty >= 1.0:
            out.append(f"loop_penalty must be >= 1 (got {self.loop_penalty})")
        if self.draft_steps < 1:
            out.append(f"draft_steps must be at least 1 (got {self.draft_steps})")
        if self.confidence not in CONFIDENCE_RULES:
            names = ", ".join(CONFIDENCE_RULES + tuple(CONFIDENCE_ALIASES))
            out.append(f"confidence must be one of {names} (got {self.confidence!r})")
        return out

    @property
    def greedy_draws(self) -> bool:
        return self.temperature == 0.0

    def with_changes(self, **changes: object) -> SamplingParams:
        """A validated copy with some fields replaced."""
        # Fields of several types: ``replace`` rejects unknown names, __post_init__ checks the values.
        return replace(self, **cast("dict[str, Any]", changes))

    @classmethod
    def for_model(cls, config: CloverConfig | None, **overrides: object) -> SamplingParams:
        """The contract's defaults with the checkpoint's ``block_size`` and ``threshold`` (from its
        ``config.json``), then ``overrides``. ``config=None`` keeps the contract's values."""
        values: dict[str, object] = {}
        if config is not None:
            values = {"block_size": config.block_size, "threshold": config.threshold}
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def coding(cls, config: CloverConfig | None = None, **overrides: object) -> SamplingParams:
        """Qwen's thinking-mode settings for coding: temperature 0.6, top_p 0.95, top_k 20, thinking
        on (no budget), up to 4096 new tokens; a repeated block raises the repetition penalty for
        what follows (``loop_action="penalize"``). ``config``: take the block size and threshold
        from that checkpoint (see :meth:`for_model`)."""
        values: dict[str, object] = {
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "thinking": True,
            "loop_action": "penalize",
            "max_new_tokens": 4096,
        }
        values.update(overrides)
        return cls.for_model(config, **values)

    @classmethod
    def greedy(cls, config: CloverConfig | None = None, **overrides: object) -> SamplingParams:
        """``coding()`` with greedy draws (temperature 0, no top-p / top-k filter): reproducible
        without a seed."""
        values: dict[str, object] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
        values.update(overrides)
        return cls.coding(config, **values)


@dataclass
class GenerationResult:
    """Outcome of one call: the generated ids (stop token excluded) and how they were obtained.

    - ``forwards``: every model forward the call ran (prefill, denoise, draft, verify and commit passes).
    - ``steps_per_block``: the denoising passes of each diffusion block (draft+verify rounds per block
      in ``self_speculative``; tokens per block in ``autoregressive``).
    - ``fallback_steps``: passes where no position cleared the threshold, so the most confident was filled.
    - ``reused_tokens``: prompt tokens whose state came from the prefix cache instead of being recomputed.
    """

    token_ids: list[int]
    finish_reason: FinishReason
    forwards: int
    steps_per_block: list[int] = field(default_factory=list)
    fallback_steps: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    commits: int = 0
    mode: Mode = "diffusion"
    text: str | None = None

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / self.forwards if self.forwards else 0.0

    @property
    def fallback_rate(self) -> float:
        """Share of denoising steps that fell back to the single most confident position."""
        steps = sum(self.steps_per_block)
        return self.fallback_steps / steps if steps else 0.0

    def stats(self) -> dict[str, object]:
        """The numbers a progress display or ``--json`` prints."""
        return {
            "tokens": len(self.token_ids),
            "finish_reason": self.finish_reason,
            "forwards": self.forwards,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "steps_per_block": list(self.steps_per_block),
            "fallback_steps": self.fallback_steps,
            "fallback_rate": round(self.fallback_rate, 4),
            "seconds": round(self.seconds, 4),
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "commits": self.commits,
            "mode": self.mode,
        }
