"""Step, wall-time and token budgets, checked before every model call.

A budget is spent when the next call could not fit: the steps taken reach ``max_steps``, the time
since the start reaches ``max_time_s`` (or the clock reaches a whole run's ``deadline``), or the
tokens used so far plus the prompt about to be sent exceed ``max_tokens`` (tokens count what the
model reads and writes on every call, as an API bills them). The clock stops while the agent
waits for a person (:meth:`Budget.pause`). Crossing ``warn_fraction`` of a resource is reported
once per resource, so front ends can show it before the run is cut off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from clover_agent.errors import CloverError, ExitCode


class LimitsExceeded(CloverError):
    """A budget is spent; the run stops before the next model call."""

    exit_code = ExitCode.BUDGET_EXHAUSTED


@dataclass
class Budget:
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    warn_fraction: float = 0.8
    steps: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    elapsed_before_s: float = 0.0  # time spent by earlier runs this one resumes
    #: A ``time.monotonic()`` by which the whole run ends, whatever came before the agent (the CI
    #: bot's --max-time); never paused.
    deadline: float | None = None
    _warned: set[str] = field(default_factory=set)
    _paused_at: float | None = None

    @property
    def elapsed_s(self) -> float:
        now = self._paused_at if self._paused_at is not None else time.monotonic()
        return self.elapsed_before_s + now - self.started

    def pause(self) -> None:
        """Stop the clock (the agent waits for a person: between requests, after an interrupt)."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        """Start the clock again where :meth:`pause` stopped it."""
        if self._paused_at is not None:
            self.started += time.monotonic() - self._paused_at
            self._paused_at = None

    def limits(self) -> dict[str, float | None]:
        return {"max_steps": self.max_steps, "max_time_s": self.max_time_s, "max_tokens": self.max_tokens}

    def remaining_time_s(self) -> float | None:
        """Seconds left before the time budget or the deadline is spent (None: no limit)."""
        left = [] if self.max_time_s is None else [self.max_time_s - self.elapsed_s]
        if self.deadline is not None:
            left.append(self.deadline - time.monotonic())
        return max(0.0, min(left)) if left else None

    def time_message(self, during: str = "") -> str:
        """Why the time ran out, ``during`` something (a model call, a tool call)."""
        at = f" during {during}" if during else ""
        left = None if self.max_time_s is None else self.max_time_s - self.elapsed_s
        if self.deadline is not None and (left is None or self.deadline - time.monotonic() <= left):
            return f"time budget exhausted{at}: the run's deadline passed (raise --max-time)"
        return f"time budget exhausted{at}: {self.elapsed_s:.0f} s of {self.max_time_s or 0:.0f} s used (raise --max-time)"

    def check(self, next_prompt_tokens: int = 0) -> list[tuple[str, float, float]]:
        """Raise :class:`LimitsExceeded` when the next model call does not fit.

        Returns the (resource, used, limit) triples that newly crossed the warning fraction.
        """
        usage = (
            ("steps", float(self.steps), self.max_steps),
            ("time_s", self.elapsed_s, self.max_time_s),
            ("tokens", float(self.tokens + next_prompt_tokens), self.max_tokens),
        )
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise LimitsExceeded(self.time_message())
        for resource, used, limit in usage:
            if limit is None:
                continue
            spent = used > limit if resource == "tokens" else used >= limit
            if spent:
                raise LimitsExceeded(_explain(resource, used, limit, self.tokens))
        warnings = []
        # Warn about what the coming call brings the usage to (the last allowed step warns too).
        usage = (("steps", float(self.steps + 1), self.max_steps), *usage[1:])
        for resource, used, limit in usage:
            if limit is not None and used >= self.warn_fraction * limit and resource not in self._warned:
                self._warned.add(resource)
                warnings.append((resource, used, float(limit)))
        return warnings

    def record_call(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.steps += 1
        self.tokens += prompt_tokens + completion_tokens


def _explain(resource: str, used: float, limit: float, tokens_so_far: int) -> str:
    if resource == "steps":
        return f"step budget exhausted: {int(used)} of {int(limit)} model calls made (raise --max-steps)"
    if resource == "time_s":
        return f"time budget exhausted: {used:.0f} s of {limit:.0f} s used (raise --max-time)"
    return (
        f"token budget exhausted: {tokens_so_far} tokens used and the next call needs "
        f"{int(used) - tokens_so_far} more, over the limit of {int(limit)} (raise --max-tokens)"
    )
