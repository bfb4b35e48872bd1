"""One tool call, from the policy's verdict to its result: ask a person where the policy says so,
make sure a checkpoint holds the workspace before a call its tool says may change it
(:meth:`~clover_agent.agent.checkpoints.Checkpoints.before_call`), run it, and emit its events.

The agent loop (:mod:`clover_agent.agent.loop`) owns the conversation; this module owns what
happens between a call's ``ToolCallStarted`` and ``ToolCallFinished`` events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.checkpoints import Checkpoints
from clover_agent.agent.notes import INTERRUPTED_TOOL
from clover_agent.agent.policy import CallView, Decision, Policy, Verdict, always_scope
from clover_agent.agent.steering import Interrupted, Steering
from clover_agent.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallInterrupted,
    CheckpointTaken,
    EventBus,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
)
from clover_agent.hooks import Hooks, ToolVerdict
from clover_agent.protocol import ToolCall
from clover_agent.tools.base import Tool, ToolContext, ToolResult, head_tail, valid_unicode
from clover_agent.tools.registry import TOOLS_GONE, run_call


@dataclass(frozen=True)
class Approval:
    """Whether a call may run, who decided (policy, user, remembered, no-terminal) and why."""

    approved: bool
    decided_by: str = "policy"
    reason: str = ""
    answer: str | None = None  # the person's answer (once, always, deny), when one was asked
    feedback: str = ""  # with the person's denial: what they said to do instead

    def refusal(self, view: CallView) -> str:
        """What the model reads about a refused call (with the person's words, when they gave some)."""
        target = view.arguments.get("path") or view.command or ""
        head = f"This call ({view.action} {target}".rstrip()
        if self.decided_by == "hook":
            return (
                f"{head}) was denied by the user's hook:\n{self.reason}\nDo not retry the call as it was; "
                "take what the hook said into account."
            )
        if self.feedback:
            return (
                f"{head}) was denied by the user, who said instead:\n{self.feedback}\n"
                "Do not retry the call as it was; do what they said."
            )
        return (
            head + f") was not allowed: {self.reason}. Do not retry it; find another way that stays "
            "within the workspace and the allowed tools."
        )


#: Characters of a call's streamed output kept for its result when it is cut (interrupted, out of
#: time): the first and last half of this (the model reads less: ``head_tail``).
KEPT_PARTIAL_CHARS = 1024 * 1024


class StreamedOutput:
    """Where a running call's output goes as it comes (``ToolContext.on_output``): each piece is
    emitted as a :class:`ToolOutput` and kept (its first and last :data:`KEPT_PARTIAL_CHARS` / 2
    characters), so a call cut before its end still has a result with what it printed."""

    def __init__(self, bus: EventBus, step: int, call: ToolCall) -> None:
        self.bus, self.step, self.call = bus, step, call
        self.head = ""
        self.tail = ""
        self.dropped = 0  # characters between head and tail not kept
        self.received = False
        self.closed = False  # the call ended: a piece still on its way is not shown after its result

    def __call__(self, piece: str) -> None:
        if not piece or self.closed:
            return
        piece = valid_unicode(piece)
        self.received = True
        self.bus.emit(ToolOutput(step=self.step, call_id=self.call.id, name=self.call.name, text=piece))
        half = KEPT_PARTIAL_CHARS // 2
        room = half - len(self.head)
        if room > 0:
            self.head += piece[:room]
            piece = piece[room:]
        if piece:
            self.tail += piece
            extra = len(self.tail) - half
            if extra > 0:
                self.tail = self.tail[extra:]
                self.dropped += extra

    @property
    def text(self) -> str:
        """What was kept of the output so far."""
        middle = f"\n[... {self.dropped} characters of output not kept ...]\n" if self.dropped else ""
        return self.head + middle + self.tail

    def cut(self, note: str) -> ToolResult:
        """The result of a call cut before its end: ``note`` and what it printed until then."""
        self.closed = True
        if not self.received:
            return ToolResult(False, note)
        partial = self.text
        shown = head_tail(partial).rstrip("\n")
        return ToolResult(
            False, f"{note}\nIts output until then:\n{shown}", {"output": partial, "partial_output": True}
        )


@dataclass(frozen=True)
class CallOutcome:
    result: ToolResult
    interrupted: bool = False
    may_have_changed: bool = False  # it ran (or started) and its tool says it may change the workspace
    out_of_time: bool = False  # cut when the run's time ran out (the caller's ``time_left``)


class ToolCaller:
    """Runs the calls of one agent: its tools, policy, approvals, checkpoints and tool context."""

    def __init__(
        self,
        tools: dict[str, Tool],
        context: ToolContext,
        bus: EventBus,
        steering: Steering,
        policy: Policy,
        approvals: Approvals | None,
        checkpoints: Checkpoints | None,
        specs: list[dict[str, Any]] | None = None,
        time_left: Callable[[], float | None] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.tools = tools
        self.hooks = hooks  # the user's PreToolUse / PostToolUse hooks (docs/hooks.md)
        self.specs = specs  # what the model is offered: a withdrawn tool leaves it too
        #: Seconds a call may still run (the time budget's rest; None: no limit), read as it starts.
        self.time_left = time_left
        self.context = context
        self.bus = bus
        self.steering = steering
        self.policy = policy
        self.approvals = approvals
        self.checkpoints = checkpoints

    async def call(self, step: int, call: ToolCall) -> CallOutcome:
        """Decide, snapshot, run; both the decision and the run can be interrupted."""
        tool = self.tools.get(call.name)
        if tool is None:  # a backend returned a call of a tool it was not given
            known = ", ".join(self.tools)
            return CallOutcome(ToolResult(False, f"Unknown tool `{call.name}`. Available tools: {known}."))
        view = CallView.of(tool, call.arguments)
        self.bus.emit(ToolCallStarted(step=step, call_id=call.id, name=call.name, arguments=call.arguments))
        started = time.monotonic()
        ran = False
        streamed = StreamedOutput(self.bus, step, call)
        context = dataclasses.replace(self.context, on_output=streamed)
        arguments, checked = call.arguments, True
        try:
            hooked = await self.steering.interruptible(lambda: self._pre_hooks(call))
            if hooked.arguments is not None:  # checked again: the schema, the policy, a person
                arguments, checked = _known(tool, hooked.arguments), False
                view = CallView.of(tool, arguments)
            if hooked.deny is not None:
                approval = self._decided(step, call, Approval(False, "hook", hooked.deny))
            else:
                approval = await self.steering.interruptible(
                    lambda: self._approve(step, call, view, hooked.ask)
                )
            if approval.approved:
                if self.checkpoints is not None and view.mutates:
                    checkpoint = await self.checkpoints.before_call(step, view.action)
                    self.bus.emit(
                        CheckpointTaken(
                            turn=step, ref=checkpoint.ref, commit=checkpoint.commit, tool=checkpoint.tool
                        )
                    )
                ran = True
                limit = self.time_left() if self.time_left is not None else None
                timer = asyncio.timeout(limit)
                try:
                    async with timer:
                        result = await self.steering.interruptible(
                            lambda: run_call(tool, arguments, context, schema_checked=checked)
                        )
                    streamed.closed = True
                    result = await self._post_hooks(call, arguments, result, hooked.context)
                except TimeoutError:
                    if not timer.expired():
                        raise  # the tool's own, not the budget's
                    took = time.monotonic() - started
                    cut = f"[The call was stopped after {took:.0f} s, with every process it started: the run's time ran out.]"
                    outcome = CallOutcome(streamed.cut(cut), False, view.mutates, out_of_time=True)
                    return self._finished(step, call, outcome, started)
            else:
                result = ToolResult(False, approval.refusal(view))
            outcome = CallOutcome(result, may_have_changed=ran and view.mutates)
        except Interrupted:
            self.bus.emit(CallInterrupted(step=step, during="tool", call_id=call.id, name=call.name))
            outcome = CallOutcome(streamed.cut(INTERRUPTED_TOOL), True, ran and view.mutates)
        return self._finished(step, call, outcome, started)

    async def _pre_hooks(self, call: ToolCall) -> ToolVerdict:
        if self.hooks is None:
            return ToolVerdict()
        return await self.hooks.pre_tool_use(call.id, call.name, call.arguments)

    async def _post_hooks(
        self, call: ToolCall, arguments: dict[str, Any], result: ToolResult, context: str
    ) -> ToolResult:
        """The result with what the hooks give the model to read: the PreToolUse hooks'
        ``additionalContext`` and what the PostToolUse hooks said of the result."""
        if self.hooks is not None:
            said = await self.hooks.post_tool_use(call.id, call.name, arguments, result.output, result.ok)
            context = "\n".join(text for text in (context, said) if text)
        if not context:
            return result
        return ToolResult(result.ok, f"{result.output}\n[The user's hooks say:]\n{context}", result.data)

    def _finished(self, step: int, call: ToolCall, outcome: CallOutcome, started: float) -> CallOutcome:
        """Emit the call's ``ToolCallFinished`` (its full output kept once); returns ``outcome``."""
        result = outcome.result
        gone = result.data.get(TOOLS_GONE)
        if isinstance(gone, list):
            self._withdraw({name for name in gone if isinstance(name, str)})
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
        return outcome

    def _withdraw(self, names: set[str]) -> None:
        """Stop offering and running ``names`` (their server stopped)."""
        for name in names:
            self.tools.pop(name, None)
        if self.specs is not None:
            self.specs[:] = [s for s in self.specs if s.get("function", {}).get("name") not in names]

    async def _approve(
        self, step: int, call: ToolCall, view: CallView, hook_asks: str | None = None
    ) -> Approval:
        """The policy's verdict, and a person's answer where it says ask (or where a hook asks for
        one, ``hook_asks``: it never loosens a denial): ``ApprovalRequested`` is emitted before the
        answer is awaited, so a front end can answer it by call id."""
        verdict = self.policy.check(view)
        if hook_asks is not None and verdict.decision is Decision.ALLOW:
            verdict = Verdict(Decision.ASK, f"hook: {hook_asks}", ("hook", view.action, view.command))
        if verdict.decision is Decision.ALLOW:
            return Approval(True)
        if verdict.decision is Decision.DENY:
            approval = Approval(False, "policy", verdict.reason)
        elif self.approvals is not None and self.approvals.allowed_always(verdict.key):
            approval = Approval(True, "remembered", f"{verdict.reason} (allowed always for this run)")
        else:
            if self.approvals is not None:
                self.approvals.open(call.id, verdict.key)
            self.bus.emit(
                ApprovalRequested(
                    step=step,
                    call_id=call.id,
                    name=call.name,
                    arguments=view.arguments,  # what runs: a hook's updatedInput, not the model's
                    reason=verdict.reason,
                    always=always_scope(verdict, view, self.policy.name),
                )
            )
            if self.approvals is None:
                approval = Approval(False, "no-terminal", f"{verdict.reason} (asked, no terminal: denied)")
            else:
                reply = await self.approvals.wait_reply(call.id)
                approval = Approval(
                    reply.answer is not Answer.DENY,
                    "user",
                    verdict.reason,
                    reply.answer.value,
                    reply.feedback,
                )
        return self._decided(step, call, approval)

    def _decided(self, step: int, call: ToolCall, approval: Approval) -> Approval:
        """Emit the ``ApprovalDecided`` of a call that was not simply allowed; returns ``approval``."""
        self.bus.emit(
            ApprovalDecided(
                step=step,
                call_id=call.id,
                name=call.name,
                approved=approval.approved,
                decided_by=approval.decided_by,
                reason=approval.reason,
                answer=approval.answer,
                feedback=approval.feedback,
            )
        )
        return approval


def _known(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """A hook's arguments less those the tool does not take (the Claude Code names it was shown
    beside ours): what is left is checked against the tool's schema."""
    known = tool.parameters.get("properties")
    return {k: v for k, v in arguments.items() if not isinstance(known, dict) or k in known}
