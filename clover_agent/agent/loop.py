"""The agent loop: ask the model, run the tool calls it makes, feed back the results, repeat.

One step: condense the conversation if it nears the window → check the budgets → the model writes
a turn (streamed as events) → a malformed turn gets its format error back as a message → each call
passes the policy, gets a checkpoint if it may change the workspace, runs in the sandbox, and its
result becomes a ``tool`` message. A prompt the backend still finds too long for its window
(:class:`ContextOverflow`) is condensed harder once and sent again. The run ends when ``finish``
is called (:class:`Submitted`), a budget is spent (:class:`LimitsExceeded`), the agent is stuck
(:class:`AgentStuck`) or the backend, the engine or the sandbox fails (any of
:data:`~clover_agent.errors.RUN_ERRORS`); every ending emits one ``Done`` event and returns a
:class:`RunResult` — no exception reaches the caller for these.

After each mutating call that changed the workspace, its diff is recorded (``WorkspaceChanged``), so
the trajectory always holds the workspace to resume from, even when the run is interrupted or killed
before its final diff is read. A resumed run restores that diff in a fresh sandbox, answers the calls
the stop cut off, and continues the recorded conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.checkpoints import Checkpoints, restore_workspace
from clover_agent.agent.context import Condensation, Condenser
from clover_agent.agent.policy import (
    DEFAULT_PRESET,
    Approver,
    Policy,
    call_action,
    decide,
    is_mutating,
    preset,
)
from clover_agent.agent.stuck import AgentStuck, StuckDetector
from clover_agent.agent.trajectory import ResumeState
from clover_agent.backends.base import BackendEvent, ContextOverflow, ModelBackend, ModelTurn
from clover_agent.backends.threads import call_soon
from clover_agent.errors import RUN_ERRORS, CloverError, ExitCode, exit_code_for, message_of
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    BudgetWarning,
    CheckpointTaken,
    ContextCondensed,
    Done,
    ErrorReported,
    EventBus,
    MessageAdded,
    ModelDelta,
    ModelResponded,
    ProvisionalBlock,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    WorkspaceChanged,
)
from clover_agent.protocol import ToolCall
from clover_agent.sandboxes.base import Sandbox, SandboxError
from clover_agent.tools import registry
from clover_agent.tools.base import ToolResult

NO_TOOL_CALL = (
    "Your reply contained no tool call. Every reply must call a tool: continue the work with one, "
    "or call `finish` with a summary if the task is done."
)
INTERRUPTED_CALL = (
    "This call did not complete: the run stopped while it ran and was resumed later in a fresh "
    "sandbox. The workspace is as it was before this call; run it again if it is still needed."
)
CUT_OFF = (
    "Your reply was cut off at the output length limit before it contained a complete tool call. "
    "Write less before the call (shorter reasoning), then call a tool."
)


class Submitted(Exception):
    """The agent called ``finish``; carries its summary."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


@dataclass
class RunResult:
    outcome: str  # submitted | budget_exhausted | stuck | error
    exit_code: ExitCode
    message: str
    summary: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    patch: str = ""

    @property
    def submitted(self) -> bool:
        return self.outcome == "submitted"


class Agent:
    """Drives one task in one sandbox with one backend; everything it does is an event on ``bus``."""

    def __init__(
        self,
        backend: ModelBackend,
        sandbox: Sandbox,
        bus: EventBus,
        *,
        run_id: str,
        policy: Policy | None = None,
        budget: Budget | None = None,
        approver: Approver | None = None,
        checkpoints: bool = True,
        stuck_repeats: int = 3,
        tools: list[dict[str, Any]] | None = None,
        condenser: Condenser | None = None,
    ) -> None:
        self.backend = backend
        self.sandbox = sandbox
        self.bus = bus
        self.run_id = run_id
        self.policy = policy or preset(DEFAULT_PRESET)
        self.budget = budget or Budget()
        self.approver = approver
        self.checkpoints = Checkpoints(sandbox, run_id) if checkpoints else None
        self.stuck = StuckDetector(stuck_repeats)
        self.tools = tools if tools is not None else registry.tool_specs()
        self.condenser = condenser or Condenser(backend.context_window)
        self.messages: list[dict[str, Any]] = []
        self._last_patch = ""  # the workspace diff as last read (recorded as WorkspaceChanged)
        self._workspace_known = True  # False while a resumed run's patch is not yet restored
        self._spent_before = ResumeState(run_id, "")  # steps/tokens/time of earlier segments, when
        # they are not counted in the budget (a resumption with a fresh budget)

    async def run(
        self, task: str, system: str, *, resume: ResumeState | None = None, fresh_budget: bool = False
    ) -> RunResult:
        """Run until the task ends one way or another. ``resume`` continues an earlier run: its
        workspace patch is applied to this (fresh) sandbox and its conversation continues. The
        earlier run's steps, tokens and time count against this budget unless ``fresh_budget``
        (they still count in the stats and the step numbers either way)."""
        self.bus.emit(
            RunStarted(
                run_id=self.run_id,
                task=task,
                backend=self.backend.name,
                tools=self.tools,
                limits=self.budget.limits(),
                resumed=resume is not None,
            )
        )
        try:
            if resume is not None:
                self._last_patch, self._workspace_known = resume.patch, False
                await restore_workspace(self.sandbox, resume.patch)
                self._workspace_known = True
                self.messages = [dict(m) for m in resume.messages]
                self._close_interrupted_calls()
                if fresh_budget:
                    self._spent_before = resume
                else:
                    self.budget.steps, self.budget.tokens = resume.steps, resume.tokens
                    self.budget.elapsed_before_s = resume.elapsed_s
            else:
                self._add({"role": "system", "content": system})
                self._add({"role": "user", "content": task})
            while True:
                await self._step()
        except Submitted as done:
            result = RunResult("submitted", ExitCode.OK, "the agent finished the task", summary=done.summary)
        except LimitsExceeded as exc:
            result = RunResult("budget_exhausted", exc.exit_code, exc.message)
        except AgentStuck as exc:
            result = RunResult("stuck", exc.exit_code, exc.message)
        except RUN_ERRORS as exc:
            result = RunResult("error", exit_code_for(exc), message_of(exc))
        except (asyncio.CancelledError, KeyboardInterrupt):
            await self._finish(RunResult("interrupted", ExitCode.INTERRUPTED, "interrupted"))
            raise
        return await self._finish(result)

    async def _finish(self, result: RunResult) -> RunResult:
        try:
            # A workspace the resumed patch could not be restored to is not the run's: keep the patch.
            result.patch = await self.sandbox.diff() if self._workspace_known else self._last_patch
        except (*RUN_ERRORS, OSError) as exc:
            result.patch = self._last_patch
            if result.outcome != "interrupted":  # an interrupt closes the sandbox: expected, not news
                result.message += (
                    f" (and the workspace diff could not be read: {exc}; the patch kept is the one "
                    "recorded after the last change)"
                )
        before = self._spent_before
        result.stats = {
            "steps": before.steps + self.budget.steps,
            "tokens": before.tokens + self.budget.tokens,
            "elapsed_s": round(before.elapsed_s + self.budget.elapsed_s, 3),
            "checkpoints": len(self.checkpoints.taken) if self.checkpoints else 0,
        }
        if not result.submitted:
            self.bus.emit(
                ErrorReported(
                    kind=result.outcome, message=result.message, fatal=True, exit_code=int(result.exit_code)
                )
            )
        self.bus.emit(
            Done(
                outcome=result.outcome,
                exit_code=int(result.exit_code),
                message=result.message,
                summary=result.summary,
                stats=result.stats,
                patch=result.patch,
            )
        )
        await self.bus.drain()
        return result

    def _add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.bus.emit(MessageAdded(message=message))

    def _close_interrupted_calls(self) -> None:
        """Answer the calls of the last assistant turn that got no result (the run stopped while they
        ran), so the resumed conversation is well formed: every call followed by its result."""
        last = next(
            (i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i]["role"] == "assistant"),
            None,
        )
        if last is None:
            return
        answered = {m.get("tool_call_id") for m in self.messages[last + 1 :] if m["role"] == "tool"}
        for call in self.messages[last].get("tool_calls") or []:
            if call["id"] not in answered:
                self._add(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "name": call["function"]["name"],
                        "content": INTERRUPTED_CALL,
                    }
                )

    async def _step(self) -> None:
        step = self._spent_before.steps + self.budget.steps + 1
        # One count per step: the condenser reuses it, and a condensation reports its new size.
        prompt_tokens = self.backend.count_tokens(self.messages, self.tools)
        condensation = self._condense(step, prompt_tokens)
        if condensation is not None:
            prompt_tokens = condensation.tokens_after
        for resource, used, limit in self.budget.check(prompt_tokens):
            self.bus.emit(BudgetWarning(resource=resource, used=used, limit=limit))
        try:
            turn = await self._complete(step)
        except ContextOverflow as overflow:
            turn = await self._complete_condensed_harder(step, overflow)
        # Servers that report no usage get the local estimate, so the token budget still holds.
        prompt_tokens = turn.prompt_tokens or prompt_tokens
        self.budget.record_call(prompt_tokens, turn.completion_tokens)
        self.bus.emit(
            ModelResponded(
                step=step,
                raw=turn.raw,
                content=turn.content,
                reasoning=turn.reasoning,
                tool_calls=[call.to_message() for call in turn.tool_calls],
                format_error=turn.format_error,
                prompt_tokens=prompt_tokens,
                completion_tokens=turn.completion_tokens,
                finish_reason=turn.finish_reason,
                prompt_messages=len(self.messages),
            )
        )
        self._add(turn.to_message())
        problem = turn.format_error
        if problem is None and not turn.tool_calls:
            problem = CUT_OFF if turn.finish_reason == "length" else NO_TOOL_CALL
        if problem is not None:
            self.bus.emit(ErrorReported(kind="format", message=problem))
            self._add({"role": "user", "content": problem})
            self._nudge(self.stuck.observe(error=problem))
            return
        for call in turn.tool_calls:
            await self._call(step, call)

    def _condense(
        self, step: int, tokens: int | None = None, condenser: Condenser | None = None
    ) -> Condensation | None:
        """Condense with ``condenser`` (default: the agent's) when over its limit; the condensation
        if it did. ``tokens``: the prompt's current size, when already counted."""
        condenser = condenser or self.condenser
        condensation = condenser.condense(
            self.messages, lambda m: self.backend.count_tokens(m, self.tools), tokens
        )
        if condensation is None:
            return None
        self.messages = condensation.messages
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

    async def _complete_condensed_harder(self, step: int, overflow: ContextOverflow) -> ModelTurn:
        """The backend found the prompt too long for its window although the condenser let it pass
        (its limit leaves only the latest messages untouched, or its count was an estimate):
        condense once more, keeping only the newest message besides the system prompt and task and
        aiming lower by the overshoot, then ask again. Still too long ends the run (exit 7)."""
        harder = replace(
            self.condenser,
            keep_recent=1,
            threshold=self.condenser.threshold * min(1.0, overflow.context_window / overflow.prompt_tokens),
        )
        if self._condense(step, condenser=harder) is not None:
            try:
                return await self._complete(step)
            except ContextOverflow as again:
                overflow = again
        raise CloverError(
            f"{overflow.message} Condensing the conversation did not make it fit: the system prompt, "
            "the task and the latest message alone are too long for this model's context window.",
            exit_code=ExitCode.AGENT_ERROR,
        )

    async def _complete(self, step: int) -> ModelTurn:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def forward(event: BackendEvent) -> None:
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
                return await self.backend.complete(self.messages, self.tools, on_event=forward)
        except TimeoutError:
            raise LimitsExceeded(
                f"time budget exhausted during a model call: {self.budget.max_time_s:.0f} s used "
                "(raise --max-time)"
            ) from None

    async def _call(self, step: int, call: ToolCall) -> None:
        self.bus.emit(ToolCallStarted(step=step, call_id=call.id, name=call.name, arguments=call.arguments))
        started = time.monotonic()
        approval = await decide(self.policy, call.name, call.arguments, self.approver)
        if approval.asked:
            self.bus.emit(
                ApprovalRequested(
                    step=step,
                    call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    reason=approval.reason,
                )
            )
        if approval.asked or not approval.approved:
            self.bus.emit(
                ApprovalDecided(
                    step=step,
                    call_id=call.id,
                    name=call.name,
                    approved=approval.approved,
                    decided_by=approval.decided_by,
                    reason=approval.reason,
                )
            )
        if not approval.approved:
            target = call.arguments.get("path") or call.arguments.get("command") or ""
            result = ToolResult(
                False,
                f"This call ({call_action(call.name, call.arguments)} {target}".rstrip()
                + f") was not allowed: {approval.reason}. Do not retry it; find another way that stays "
                "within the workspace and the allowed tools.",
            )
        else:
            if self.checkpoints is not None and is_mutating(call.name, call.arguments):
                checkpoint = await self.checkpoints.snapshot(step, call_action(call.name, call.arguments))
                self.bus.emit(
                    CheckpointTaken(
                        turn=step, ref=checkpoint.ref, commit=checkpoint.commit, tool=checkpoint.tool
                    )
                )
            result = await registry.execute(call.name, call.arguments, self.sandbox)
        full = result.data.get("output")
        if isinstance(full, str):  # kept once, as full_output (a shell's output can be megabytes)
            data = {key: value for key, value in result.data.items() if key != "output"}
        else:
            full, data = result.output, result.data
        self.bus.emit(
            ToolCallFinished(
                step=step,
                call_id=call.id,
                name=call.name,
                output=result.output,
                is_error=not result.ok,
                full_output=full,
                data=data,
                duration_s=round(time.monotonic() - started, 3),
            )
        )
        self._add({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.output})
        if registry.SANDBOX_LOST in result.data:  # every later call would fail the same way
            raise SandboxError(
                f"the sandbox stopped working during the {call.name} call: {result.data[registry.SANDBOX_LOST]}"
            )
        if approval.approved and is_mutating(call.name, call.arguments):
            await self._record_workspace(step, call.id)
        if result.ends_task:
            raise Submitted(str(result.data.get("summary", "")))
        self._nudge(self.stuck.observe((call.name, call.arguments), None if result.ok else result.output))

    async def _record_workspace(self, step: int, call_id: str) -> None:
        """Record the workspace diff when a call changed it: the trajectory then always holds the
        state to resume from, even if the run is interrupted or killed before its end."""
        try:
            patch = await self.sandbox.diff()
        except OSError as exc:
            raise SandboxError(f"the workspace diff could not be read: {exc}") from exc
        if patch != self._last_patch:
            self._last_patch = patch
            self.bus.emit(WorkspaceChanged(step=step, call_id=call_id, patch=patch))

    def _nudge(self, message: str | None) -> None:
        if message is not None:
            self.bus.emit(ErrorReported(kind="stuck", message=message))
            self._add({"role": "user", "content": message})
