"""A denoising pass's token choice and LowConfidence fill as the fused Triton step
(``clover_agent.kernels.low_confidence.low_confidence_step``): two or three launches instead of the
15 to 39 PyTorch operators of :mod:`.choice` and :mod:`.controls`, the controls as the kernel's
``LogitsAdjustment``, and one read-back of the pass's result.

Greedy choice is the same as the PyTorch path's (the kernel's references are the engine's rules);
sampled draws come from the kernel's seeded Philox stream, so they match the PyTorch path in
distribution, not token for token. ``BlockDecoder(choice=...)`` picks the path: ``"auto"`` takes
this one on a CUDA device where the Triton kernels run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from clover_agent.engine.ops import triton_unusable
from clover_agent.engine.ops.transfer import upload

if TYPE_CHECKING:
    from clover_agent.engine.decoding.call import Call
    from clover_agent.engine.decoding.graphs import Body, StepGraphs, StepShape
    from clover_agent.engine.decoding.sampling import SamplingParams

CHOICES = ("auto", "torch", "triton")


def fused_choice_problem(params: SamplingParams, device: torch.device) -> str | None:
    """Why the fused step cannot serve these parameters on ``device`` (None when it can)."""
    problem = triton_unusable(device)
    if problem is not None:
        return problem
    from clover_agent.kernels.low_confidence import MAX_TOP_K

    if not params.greedy_draws and params.top_k > MAX_TOP_K:
        return f"top_k {params.top_k} is more than the kernel's {MAX_TOP_K}"
    return None


class FusedChoice:
    """The fused step for one call: its ``TokenChoice`` and its draw seed (a device counter)."""

    def __init__(self, params: SamplingParams, mask_token_id: int | None, device: torch.device) -> None:
        from clover_agent.kernels.low_confidence import TokenChoice

        self.choice = TokenChoice(
            temperature=0.0 if params.greedy_draws else params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            mask_token_id=mask_token_id,
            confidence_rule=params.confidence,  # the same names
        )
        self.seed = torch.full(
            (1,), params.seed if params.seed is not None else 0, dtype=torch.long, device=device
        )

    def denoise(
        self, call: Call, logits: torch.Tensor, tokens: list[int], decided: list[bool], fill_all: bool
    ) -> bool:
        """``DecodeCall.denoise`` on the fused step: ``logits`` [len(tokens), V]; ``tokens`` and
        ``decided`` updated in place; whether LowConfidence fell back to one slot."""
        from clover_agent.kernels.low_confidence import low_confidence_step

        device = logits.device
        slots = len(tokens)
        base = len(call.generated)
        on_device = upload(tokens, device)
        done = upload(decided, device, torch.bool)
        adjustment = call.controls.adjustment([base + i for i in range(slots)], tokens, decided)
        # fill_all: every open slot passes a threshold below any confidence
        threshold = -1.0 if fill_all else call.threshold
        result = low_confidence_step(
            logits, on_device, done, self.choice, threshold, adjustment, seed=self.seed
        )
        return read_pass(pack_pass(on_device, result.fill, result.fallback), tokens, decided) and not fill_all


def pack_pass(tokens: torch.Tensor, fill: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """What a pass reads back, as one int64 tensor: the block's tokens, the rows filled now, the
    fallback flag."""
    return torch.cat([tokens, fill.long(), fallback.long()])


def read_pass(packed: torch.Tensor, tokens: list[int], decided: list[bool]) -> bool:
    """The pass's one read-back (``packed``: :func:`pack_pass`); ``tokens`` and ``decided`` take the
    filled rows. Returns the fallback flag."""
    slots = len(tokens)
    values = packed.tolist()
    for slot in range(slots):
        if values[slots + slot]:
            tokens[slot] = values[slot]
            decided[slot] = True
    return bool(values[-1])


@dataclass(frozen=True)
class PassVariant:
    """What a denoising pass captured with its token choice bakes in (the graph's key, with its step
    shape): the choice, the threshold, the penalties' numbers (None: no penalty), the columns the
    controls bias and whether they force rows. The per-pass numbers live in :class:`ChoiceProgram`."""

    choice: Any  # kernels.low_confidence.TokenChoice
    threshold: float
    penalties: tuple[float, float, float] | None
    columns: tuple[int, ...]
    forcing: bool


class ChoiceProgram:
    """A denoising pass as one step program: the forward, then the fused LowConfidence step on what
    it wrote, captured together (``StepGraphs.run``), so a pass replays one graph and reads back once.

    Everything the captured kernels touch has a fixed address and lives here, shared by the calls of
    one decoder (one at a time): the block's tokens (its next input: mask tokens where undecided) and
    decided flags, the draw seed (the call's :class:`FusedChoice` draws from it), the penalty counts
    (copied from the call's controls each pass) and the controls' per-row numbers in the call's
    fixed layout (``LogitsControls.layout``: a column biased by zero changes nothing).
    """

    def __init__(self, block_size: int, vocab_size: int, device: torch.device) -> None:
        self.block_size, self.vocab_size, self.device = block_size, vocab_size, device
        self.tokens = torch.zeros(block_size, dtype=torch.long, device=device)
        self.decided = torch.zeros(block_size, dtype=torch.bool, device=device)
        self.seed = torch.zeros(1, dtype=torch.long, device=device)
        self.forced = torch.full((block_size,), -1, dtype=torch.long, device=device)
        self._counts: torch.Tensor | None = None
        self._columns: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        #: The host list of the block whose state the buffers hold (None: not known to hold one).
        self.staged: list[int] | None = None

    @property
    def state(self) -> tuple[torch.Tensor, ...]:
        """What a pass updates in place (kept unchanged by a capture)."""
        return self.tokens, self.decided, self.seed

    def start(self, fused: FusedChoice) -> None:
        """A call begins: its draws come from the shared seed, set to the call's."""
        self.seed.copy_(fused.seed)
        fused.seed = self.seed
        self.staged = None

    def variant(self, call: Call, fused: FusedChoice, threshold: float) -> PassVariant:
        controls = call.controls
        active = controls.active
        columns, forcing = controls.layout() if active else ((), False)
        penalties = None
        if active and controls.penalizing:
            p = controls.params
            penalties = (controls.repetition_penalty, p.presence_penalty, p.frequency_penalty)
        return PassVariant(fused.choice, threshold, penalties, columns, forcing)

    def counts(self) -> torch.Tensor:
        if self._counts is None:
            self._counts = torch.zeros(self.vocab_size, device=self.device)
        return self._counts

    def column_buffers(self, columns: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bias columns' token ids [NB] and per-row biases [block, NB] of a layout."""
        if columns not in self._columns:
            ids = upload(list(columns), self.device)
            bias = torch.zeros(self.block_size, len(columns), dtype=torch.float32, device=self.device)
            self._columns[columns] = (ids, bias)
        return self._columns[columns]

    def adjustment(self, variant: PassVariant) -> Any:
        """The variant's ``LogitsAdjustment`` over this program's buffers (None: no controls)."""
        from clover_agent.kernels.low_confidence import LogitsAdjustment

        if variant.penalties is None and not variant.columns and not variant.forcing:
            return None
        repetition, presence, frequency = variant.penalties or (1.0, 0.0, 0.0)
        ids, bias = self.column_buffers(variant.columns) if variant.columns else (None, None)
        return LogitsAdjustment(
            counts=self.counts() if variant.penalties is not None else None,
            repetition_penalty=repetition,
            presence_penalty=presence,
            frequency_penalty=frequency,
            bias_token_ids=ids,
            row_bias=bias,
            forced_token=self.forced if variant.forcing else None,
        )

    def body(self, graphs: StepGraphs, shape: StepShape, variant: PassVariant) -> Body:
        """The captured pass: the block's tokens into the input's last rows, the forward, the fused
        step on the block's logits; its output, what the host reads back (:func:`pack_pass`)."""
        from clover_agent.kernels.low_confidence import low_confidence_step

        adjustment = self.adjustment(variant)
        block = self.block_size

        def run(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            ids[shape.tokens - block :].copy_(self.tokens)
            logits = graphs.forward(ids, shape)[-block:]
            result = low_confidence_step(
                logits,
                self.tokens,
                self.decided,
                variant.choice,
                variant.threshold,
                adjustment,
                seed=self.seed,
            )
            return (pack_pass(self.tokens, result.fill, result.fallback),)

        return run

    def stage(
        self,
        call: Call,
        variant: PassVariant,
        positions: Sequence[int],
        tokens: list[int],
        decided: list[bool],
    ) -> None:
        """Before a replay: the block's state when the buffers do not hold it yet, the pass's
        steering numbers, the call's penalty counts (device to device)."""
        if self.staged is not tokens:
            upload(tokens, self.device, into=self.tokens)
            upload(decided, self.device, torch.bool, into=self.decided)
            self.staged = tokens
        if variant.columns or variant.forcing:
            biases, forced = call.controls.pass_numbers(positions, tokens, decided)
            if variant.columns:
                _, bias = self.column_buffers(variant.columns)
                rows = [[column[r] for _, column in biases] for r in range(len(positions))]
                upload([v for row in rows for v in row], self.device, into=bias)
            if variant.forcing:
                upload(forced, self.device, into=self.forced)
        if variant.penalties is not None:
            self.counts().copy_(call.controls.counts, non_blocking=True)
