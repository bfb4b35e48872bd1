"""One model call of the agent loop: keep the conversation inside the window, stream the reply as
events, and stop at the time budget.

The loop (:mod:`clover_agent.agent.loop`) owns the conversation; :class:`ModelCaller` condenses it
when it nears the backend's window (emitting ``ContextCondensed``), forwards what the backend
streams (from whichever thread it streams) as ``ModelDelta`` / ``ProvisionalBlock`` events, and
condenses harder once when the backend still finds the prompt too long.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import replace
from typing import Any

from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.condenser import Condensation, Condenser
from clover_agent.backends.base import BackendEvent, ContextOverflow, ModelBackend, ModelTurn
from clover_agent.backends.threads import call_soon
from clover_agent.errors import CloverError, ExitCode
from clover_agent.events import ContextCondensed, EventBus, ModelDelta, PromptRefused, ProvisionalBlock

Messages = list[dict[str, Any]]


class ModelCaller:
    """The agent's model calls: its backend, tools, budget and condenser."""

    def __init__(
        self,
        backend: ModelBackend,
        tool_specs: list[dict[str, Any]],
        bus: EventBus,
        budget: Budget,
        condenser: Condenser,
    ) -> None:
        self.backend = backend
        self.tool_specs = tool_specs
        self.bus = bus
        self.budget = budget
        self.condenser = condenser

    def count(self, messages: Messages) -> int:
        """The prompt's size in tokens (the backend renders it; counted once per step)."""
        return self.backend.count_tokens(messages, self.tool_specs)

    def condense(
        self, step: int, messages: Messages, tokens: int | None = None, condenser: Condenser | None = None
    ) -> Condensation | None:
        """Condense with ``condenser`` (default: the agent's) when over its limit; the condensation
        if it did. ``tokens``: the prompt's current size, when already counted."""
        condensation = (condenser or self.condenser).condense(messages, self.count, tokens)
        if condensation is not None:
            self.bus.emit(
                ContextCondensed(
                    step=step,
                    note=condensation.note,
                    dropped=condensation.dropped,
                    tokens_before=condensation.tokens_before,
                    tokens_after=condensation.tokens_after,
                    messages=condensation.messages,
                )
            )
        return condensation

    async def complete(self, step: int, messages: Messages) -> tuple[ModelTurn, Messages]:
        """The model's turn, and the conversation it was given (condensed harder when the backend
        found ``messages`` too long for its window although the condenser let them pass)."""
        try:
            return await self._complete(step, messages), messages
        except ContextOverflow as overflow:
            self._refused(step, overflow)
            return await self._complete_condensed_harder(step, messages, overflow)

    def _refused(self, step: int, overflow: ContextOverflow) -> None:
        self.bus.emit(
            PromptRefused(
                step=step, prompt_tokens=overflow.prompt_tokens, context_window=overflow.context_window
            )
        )

    async def _complete_condensed_harder(
        self, step: int, messages: Messages, overflow: ContextOverflow
    ) -> tuple[ModelTurn, Messages]:
        """Condense once more, keeping only the newest message besides the system prompt and task
        and aiming lower by the overshoot, then ask again. Still too long ends the run (exit 7)."""
        if not any(message["role"] == "assistant" for message in messages):
            # Nothing but the system prompt and the task (and perhaps a note): nothing to condense.
            raise CloverError(
                f"the system prompt and the task alone are {overflow.prompt_tokens:,} tokens, and this "
                f"model's context window holds {overflow.context_window:,} (prompt and answer together): "
                "no model call was made. Use a model with a larger context window, or a shorter task.",
                exit_code=ExitCode.AGENT_ERROR,
            )
        harder = replace(
            self.condenser,
            keep_recent=1,
            threshold=self.condenser.threshold * min(1.0, overflow.context_window / overflow.prompt_tokens),
        )
        condensation = self.condense(step, messages, condenser=harder)
        if condensation is not None:
            try:
                return await self._complete(step, condensation.messages), condensation.messages
            except ContextOverflow as again:
                self._refused(step, again)
                overflow = again
        raise CloverError(
            f"{overflow.message} Condensing the conversation did not make it fit: the system prompt, "
            "the task and the latest message alone are too long for this model's context window.",
            exit_code=ExitCode.AGENT_ERROR,
        )

    async def _complete(self, step: int, messages: Messages) -> ModelTurn:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def forward(event: BackendEvent) -> None:
            out: ProvisionalBlock | ModelDelta
            if event.block is not None:
                out = ProvisionalBlock(step=step, **dataclasses.asdict(event.block))
            else:
                out = ModelDelta(step=step, kind=event.kind, text=event.text)
            # Backends may stream from a worker thread (the engine does); the bus lives on the loop.
            if threading.get_ident() == loop_thread:
                self.bus.emit(out)
            else:
                call_soon(loop, self.bus.emit, out)

        remaining = self.budget.remaining_time_s()
        try:
            async with asyncio.timeout(remaining):
                return await self.backend.complete(messages, self.tool_specs, on_event=forward)
        except TimeoutError:
            raise LimitsExceeded(self.budget.time_message("a model call")) from None
