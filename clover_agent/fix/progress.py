"""The figures of a ``fix`` run, from its events: what the live status line and the final line show.

:class:`RunFigures` is a bus subscriber. It counts what happened (model calls started, tokens read
and written, time in model calls, the engine's forward passes) and knows what is going on now (a
phase of the workflow, a model call, a tool call), so the status line can say it at any moment and
the final line can say it once the run is over. A model call cut off before its turn came back
(a time budget, Ctrl-C) still counts: its streamed text gives an estimate of what it wrote. A call
whose prompt the backend refused (``PromptRefused``: too long for the context window) was not made
and does not count. A running command's status says the last line it printed (``ToolOutput``), and
a test run that has gone on past one test's limit says it is running long.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from clover_agent.backends.base import CHARS_PER_TOKEN
from clover_agent.events import (
    Event,
    ModelCallStarted,
    ModelDelta,
    ModelResponded,
    PhaseStarted,
    PromptRefused,
    ProvisionalBlock,
    RunStarted,
    SandboxProgress,
    TaskFinished,
    TaskResumed,
    TaskStarted,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
)
from clover_agent.tools.run_tests import default_test_timeout

PHASE_NAMES = {"target_before": "tests before", "suite_before": "tests before"}
#: The phases that run tests (a run of them that goes on past one test's limit is running long).
TEST_PHASES = frozenset({"tests before", "verification"})
#: A rate over less time than this says nothing (a replayed turn takes no time): it is not shown.
MIN_RATE_SECONDS = 0.1
#: Characters of a running command's output held to find its last line, and of that line shown.
OUTPUT_TAIL_CHARS = 1024
OUTPUT_LINE_CHARS = 80


@dataclass
class _Call:
    """The model call under way."""

    step: int
    prompt_tokens: int
    started: float
    chars: int = 0  # streamed so far (text and reasoning)
    passes: int = 0  # provisional blocks seen (engine: one per denoising pass)
    thinking: bool = False  # the latest stream is reasoning

    @property
    def tokens_out(self) -> int:
        """An estimate from the characters streamed (the backend counts them once the turn is back)."""
        return math.ceil(self.chars / CHARS_PER_TOKEN)


@dataclass
class RunFigures:
    """Counts and the current activity of one run (see the module docstring)."""

    clock: float = field(default_factory=time.monotonic)  # when the run (this process's part) began
    max_steps: int | None = None
    steps: int = 0  # model calls started in this process
    steps_before: int = 0  # model calls of the run's earlier segments (a resumed run)
    tokens_in: int = 0  # prompt tokens, summed over calls (as an API bills them)
    tokens_out: int = 0  # written tokens of finished calls
    model_seconds: float = 0.0  # time in finished model calls
    forwards: int = 0  # model forward passes of finished calls (engine only; 0: unknown)
    cut_off: int = 0  # model calls that ended without a turn
    refused: int = 0  # prompts the backend refused as too long (those calls were not made)
    activity: str = "starting"
    detail: str = ""
    since: float = field(default_factory=time.monotonic)  # when the activity began
    call: _Call | None = None
    finished: bool = False
    loading: str = ""  # the backend's own progress (the engine loading its weights), shown while set
    output_tail: str = ""  # the end of what the running tool call printed so far (raw)
    test_timeout: float | None = None  # each test's limit, as the run was started with (launch)

    def __call__(self, event: Event) -> None:
        now = time.monotonic()
        if isinstance(event, TaskStarted | TaskResumed):
            self.test_timeout = _test_limit(event.launch)
            self._doing("set-up", "", now)
        elif isinstance(event, PhaseStarted):
            self._doing(event.phase, event.detail, now)
        elif isinstance(event, SandboxProgress):  # a long sandbox start: what it does now
            self._doing(self.activity, event.message, now)
        elif isinstance(event, RunStarted):
            self.max_steps = event.limits.get("max_steps")
            self._end_call(now)
            self._doing("agent", "", now)
        elif isinstance(event, ModelCallStarted):
            self._end_call(now)
            self.steps += 1
            self.tokens_in += event.prompt_tokens
            self.call = _Call(event.step, event.prompt_tokens, now)
            self._doing("model", "", now)
        elif isinstance(event, ModelDelta) and self.call is not None:
            self.loading = ""
            self.call.chars += len(event.text)
            self.call.thinking = event.kind == "reasoning"
        elif isinstance(event, PromptRefused):
            self.refused += 1
            if self.call is not None:  # not made: a condensed retry's turn counts as a call of its own
                self.steps -= 1
                self.tokens_in -= self.call.prompt_tokens
                self.call = None
            self._doing("agent", "", now)
        elif isinstance(event, ProvisionalBlock) and self.call is not None:
            self.call.passes += 1
        elif isinstance(event, ModelResponded):
            if self.call is None:  # a turn with no start seen: count it whole
                self.steps += 1
                self.tokens_in += event.prompt_tokens
            elif event.prompt_tokens != self.call.prompt_tokens:  # the server's count beats the estimate
                self.tokens_in += event.prompt_tokens - self.call.prompt_tokens
            self.tokens_out += event.completion_tokens
            self.forwards += event.forwards
            self.model_seconds += event.seconds or (now - self.call.started if self.call else 0.0)
            self.call = None
            self._doing("agent", "", now)
        elif isinstance(event, ToolCallStarted):
            self._end_call(now)
            self.output_tail = ""
            self._doing("tool", event.name, now)
        elif isinstance(event, ToolOutput) and self.activity == "tool":
            self.output_tail = (self.output_tail + event.text)[-OUTPUT_TAIL_CHARS:]
        elif isinstance(event, ToolCallFinished):
            self.output_tail = ""
            self._doing("agent", "", now)
        elif isinstance(event, TestsRun):
            self._doing(PHASE_NAMES.get(event.phase, "verification"), "", now)
        elif isinstance(event, TaskFinished):
            self._end_call(now)
            self.finished = True

    def _doing(self, activity: str, detail: str, now: float) -> None:
        if (activity, detail) != (self.activity, self.detail):
            self.activity, self.detail, self.since = activity, detail, now

    def _end_call(self, now: float) -> None:
        """A call that got no turn back (cut off): what it streamed counts as an estimate."""
        if self.call is not None:
            self.tokens_out += self.call.tokens_out
            self.model_seconds += now - self.call.started
            self.cut_off += 1
            self.call = None

    # -- what is shown -------------------------------------------------------------------------------

    def out_now(self) -> int:
        return self.tokens_out + (self.call.tokens_out if self.call else 0)

    def tokens_per_second(self, now: float | None = None) -> float:
        """Written tokens per second in the model (0 when too little time was spent to tell)."""
        seconds = self.model_seconds
        if self.call is not None:
            seconds += (now or time.monotonic()) - self.call.started
        return self.out_now() / seconds if seconds >= MIN_RATE_SECONDS else 0.0

    def tokens_per_forward(self) -> float | None:
        """Written tokens per model forward (engine only): exact for finished calls, the passes seen
        for the one under way."""
        forwards = self.forwards + (self.call.passes if self.call else 0)
        return self.out_now() / forwards if forwards else None

    def figures(self, now: float | None = None) -> str:
        """``step 3/50 · 12.3 s · 4,210 in / 312 out · 41 tok/s · 2.7 tok/fwd``."""
        now = now or time.monotonic()
        step = self.steps_before + self.steps
        parts = [f"step {step}" + (f"/{self.steps_before + self.max_steps}" if self.max_steps else "")]
        parts.append(duration(now - self.clock))
        parts.append(f"{self.tokens_in:,} in / {self.out_now():,} out tokens")
        rate = self.tokens_per_second(now)
        if rate:
            parts.append(f"{rate:,.0f} tok/s")
        per_forward = self.tokens_per_forward()
        if per_forward is not None:
            parts.append(f"{per_forward:.2f} tok/forward")
        return " · ".join(parts)

    def status(self, now: float | None = None) -> str:
        """The live status line: what is going on now, for how long, then the figures."""
        now = now or time.monotonic()
        if self.activity == "model" and self.call is not None:
            what = "model thinking" if self.call.thinking else "model writing"
            if not self.call.chars:
                what = self.loading or "model reading the prompt"
        elif self.activity == "tool":
            what = f"running {self.detail}"
            lines = [line for line in self.output_tail.splitlines() if line.strip()]
            if lines:  # raw: the console shows the status line terminal_safe
                last = " ".join(lines[-1].split())
                cut = last if len(last) <= OUTPUT_LINE_CHARS else last[: OUTPUT_LINE_CHARS - 1] + "…"
                what += f": {cut}"
        elif self.activity == "agent":
            what = "agent"
        else:
            what = self.activity + (f": {self.detail}" if self.detail else "")
            limit = self.test_timeout
            if self.activity in TEST_PHASES and limit is not None and now - self.since > limit:
                what += f" · running long (a test past {duration(limit)} fails alone)"
        return f"{what} ({duration(now - self.since)}) · {self.figures(now)}"

    def final(self) -> str:
        """The figures once the run is over (what the summary's last lines say)."""
        if not self.steps and self.refused:
            earlier = (
                f" (after {self.steps_before} in the run's earlier segments)" if self.steps_before else ""
            )
            return f"no model call made{earlier}"  # the error says why
        text = f"{self.steps} model call{'' if self.steps == 1 else 's'}"
        if self.steps_before:
            text += f" (after {self.steps_before} in the run's earlier segments)"
        if self.cut_off:
            text += f", {self.cut_off} cut off"
        if self.refused:
            text += f", {self.refused} prompt(s) refused as too long for the context window"
        text += f"; {self.tokens_in:,} tokens in, {self.tokens_out:,} out"
        rate = self.tokens_per_second()
        if rate:
            text += f" ({rate:,.0f} tok/s over {duration(self.model_seconds)} in the model)"
        per_forward = self.tokens_per_forward()
        if per_forward is not None:
            text += f"; {per_forward:.2f} tokens per forward"
        return text


def _test_limit(launch: dict[str, Any]) -> float | None:
    """Each test's limit from a launch record (``--test-timeout``, else a fifth of the suite's)."""

    def seconds(key: str) -> float | None:
        value = launch.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        return None

    given, suite = seconds("test_timeout"), seconds("suite_timeout")
    return given or (None if suite is None else default_test_timeout(suite))


def duration(seconds: float) -> str:
    """``4.2 s``, ``2 min 05 s``, ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
