"""The agent loop: ask the model, run the tool calls it makes, feed back the results, repeat.

:class:`Agent` sequences a run: one step takes the messages sent in, condenses the conversation if
needed, checks the budgets, asks the model for a turn and runs each call through the policy, a
checkpoint and the sandbox. Every ending (``finish``, a spent budget, a stuck agent, a backend,
engine or sandbox failure) emits one ``Done`` event and returns a :class:`RunResult`; no exception
reaches the caller for these. Front ends steer a running agent from their own tasks (``send``,
``interrupt``, approvals, ``undo``, ``continue_with``). The step, the endings, resuming and the
seams are in docs/architecture.md ("The agent loop", "Steering the agent"); what stands alone lives
beside it: :mod:`.calls`, :mod:`.model_call`, :mod:`.steering`, :mod:`.approvals`, :mod:`.notes`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.calls import ToolCaller
from clover_agent.agent.checkpoints import Checkpoint, Checkpoints, restore_workspace
from clover_agent.agent.condenser import Condenser
from clover_agent.agent.model_call import ModelCaller
from clover_agent.agent.notes import CUT_OFF, INTERRUPTED_CALL, INTERRUPTED_REPLY, NO_TOOL_CALL, NOT_RUN
from clover_agent.agent.plan import PLAN_NOTE, PLAN_POLICY, Plan, approved_message
from clover_agent.agent.policy import DEFAULT_PRESET, Policy, preset
from clover_agent.agent.steering import Interrupted, Steering
from clover_agent.agent.stuck import AgentStuck, StuckDetector
from clover_agent.agent.trajectory import ResumeState
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS, CloverError, ExitCode, UsageError, exit_code_for, message_of
from clover_agent.events import (
    BudgetWarning,
    CallInterrupted,
    Done,
    ErrorReported,
    EventBus,
    MessageAdded,
    ModelCallStarted,
    ModelResponded,
    PlanUpdated,
    RunStarted,
    WorkspaceChanged,
    WorkspaceUndone,
)
from clover_agent.hooks import Hooks
from clover_agent.protocol import ToolCall
from clover_agent.sandboxes.base import Sandbox, SandboxError
from clover_agent.sandboxes.errors import WorkspaceDiffError
from clover_agent.tools.base import Tool, ToolContext
from clover_agent.tools.plan import PLAN_DATA
from clover_agent.tools.registry import SANDBOX_LOST, default_tools


class Submitted(Exception):
    """The agent called ``finish``; carries its summary."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


class Answered(Exception):
    """In a conversation, the model replied in prose with no tool call: that is its answer."""


class PromptBlocked(CloverError):
    """A UserPromptSubmit hook kept a person's request from the model; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the request was not sent to the model: {reason}")
        self.reason = reason


class Planned(Exception):
    """In plan mode, the agent proposed its plan (``propose_plan``): the turn ends with it."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan.summary)
        self.plan = plan


@dataclass
class RunResult:
    outcome: str  # submitted | answered | planned | budget_exhausted | stuck | error | interrupted
    exit_code: ExitCode
    message: str
    summary: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    patch: str = ""
    plan: Plan | None = None  # ``planned``: the plan proposed
    blocked: str = ""  # ``error``: why a UserPromptSubmit hook kept the request from the model

    @property
    def submitted(self) -> bool:
        return self.outcome == "submitted"

    @property
    def ended_well(self) -> bool:
        """The turn ended as the agent meant: ``finish`` called, a plan proposed, or (in a
        conversation) answered."""
        return self.outcome in ("submitted", "answered", "planned")


class Agent:
    """Drives one conversation in one sandbox with one backend; everything it does is an event on
    ``bus``.

    - ``tools``: the tool objects it offers the model and runs (default: the standard ones).
    - ``approvals``: where a person answers the calls the policy asks about (None: no one can be
      asked, so those are denied).
    - ``conversation``: a person reads the replies (the TUI, ACP): a reply in prose with no tool
      call answers them and ends the turn. Otherwise (``fix``, the CI bot) every reply must call a
      tool, and one that does not is told so and costs a step.
    """

    def __init__(
        self,
        backend: ModelBackend,
        sandbox: Sandbox,
        bus: EventBus,
        *,
        run_id: str,
        policy: Policy | None = None,
        budget: Budget | None = None,
        approvals: Approvals | None = None,
        checkpoints: bool = True,
        stuck_repeats: int = 3,
        tools: Sequence[Tool] | None = None,
        condenser: Condenser | None = None,
        conversation: bool = False,
        hooks: Hooks | None = None,
    ) -> None:
        self.backend = backend
        self.hooks = hooks
        self.conversation = conversation
        self.result: RunResult | None = None  # the last run's, once it ended
        self.sandbox = sandbox
        self.bus = bus
        self.run_id = run_id
        self.checkpoints = Checkpoints(sandbox, run_id) if checkpoints else None
        self.stuck = StuckDetector(stuck_repeats)
        self.tools: dict[str, Tool] = {tool.name: tool for tool in (tools or default_tools())}
        self.tool_specs: list[dict[str, Any]] = [tool.spec() for tool in self.tools.values()]
        self.tool_context = ToolContext.of(sandbox)
        self.condenser = condenser or Condenser(backend.context_window)
        self.steering = Steering()
        self.model = ModelCaller(backend, self.tool_specs, bus, budget or Budget(), self.condenser)
        self.caller = ToolCaller(
            self.tools,
            self.tool_context,
            bus,
            self.steering,
            policy or preset(DEFAULT_PRESET),
            approvals,
            self.checkpoints,
            self.tool_specs,
            time_left=lambda: self.budget.remaining_time_s(),
            hooks=hooks,
        )
        self.messages: list[dict[str, Any]] = []
        self.running = False
        #: True while a run waits for a user message after an interrupt (nothing under way).
        self.waiting_for_user = False
        self._last_patch = ""  # the workspace diff as last read (recorded as WorkspaceChanged)
        self._workspace_known = True  # False while a resumed run's patch is not yet restored
        self._spent_before = ResumeState(run_id, "")  # steps/tokens/time of earlier segments, when
        # they are not counted in the budget (a resumption with a fresh budget)
        #: The approved plan whose steps ``update_plan`` tracks (None: none approved).
        self.plan: Plan | None = None
        self._policy_before_plan: Policy | None = None  # while planning: the policy to go back to

    # The budget, policy and approvals live where they are used; a front end may replace them
    # between requests (a fresh budget per request, a policy switched by the person).
    @property
    def budget(self) -> Budget:
        return self.model.budget

    @budget.setter
    def budget(self, budget: Budget) -> None:
        # What the replaced budget counted still counts in the stats and the step numbers (the
        # checkpoints are keyed by step, so steps must not start again at 1).
        old, before = self.model.budget, self._spent_before
        self._spent_before = ResumeState(
            self.run_id,
            "",
            steps=before.steps + old.steps,
            tokens=before.tokens + old.tokens,
            elapsed_s=before.elapsed_s + old.elapsed_s,
        )
        self.model.budget = budget

    @property
    def policy(self) -> Policy:
        return self.caller.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.caller.policy = policy

    @property
    def approvals(self) -> Approvals | None:
        return self.caller.approvals

    @approvals.setter
    def approvals(self, approvals: Approvals | None) -> None:
        self.caller.approvals = approvals

    # -- plan mode -----------------------------------------------------------------------------------

    @property
    def planning(self) -> bool:
        """Whether the agent is in plan mode (read-only until a plan is approved)."""
        return self._policy_before_plan is not None

    def start_planning(self) -> None:
        """Enter plan mode: from the next call, only what :data:`PLAN_POLICY` allows runs, and each
        request carries :data:`PLAN_NOTE` until a plan is approved or plan mode is left."""
        if not self.planning:
            self._policy_before_plan = self.policy
            self.policy = PLAN_POLICY

    def leave_planning(self, policy: Policy | None = None) -> None:
        """Leave plan mode without a plan: back to ``policy`` (default: the one before planning)."""
        if self.planning:
            before, self._policy_before_plan = self._policy_before_plan, None
            self.policy = policy or before or preset(DEFAULT_PRESET)

    def approve_plan(self, plan: Plan, policy: Policy | None = None, note: str = "") -> str:
        """The person approved ``plan`` (perhaps edited): plan mode ends, ``policy`` (default: the one
        before planning) applies, the steps are tracked. Returns the message to go on with
        (:meth:`continue_with`), which carries the plan into the conversation."""
        self.leave_planning(policy)
        self.plan = Plan(
            plan.summary, [type(s)(s.step, "pending") for s in plan.steps], plan.files, plan.checks
        )
        self.bus.emit(PlanUpdated(stage="approved", plan=self.plan.to_dict(), step=self.next_step - 1))
        return approved_message(self.plan, note)

    # -- what front ends call ------------------------------------------------------------------------

    async def run(
        self, task: str, system: str, *, resume: ResumeState | None = None, fresh_budget: bool = False
    ) -> RunResult:
        """Run until the task ends one way or another. ``resume`` continues an earlier run: its
        workspace patch is applied to this (fresh) sandbox and its conversation continues (one whose
        request a UserPromptSubmit hook blocked holds none: ``task`` is screened again). The
        earlier run's steps, tokens and time count against this budget unless ``fresh_budget``
        (they still count in the stats and the step numbers either way)."""

        async def begin() -> None:
            if resume is not None:
                await self.resume(resume, fresh_budget=fresh_budget)
                if not any(m.get("role") == "user" for m in self.messages):  # its request was blocked
                    self._add({"role": "user", "content": await self._screened(task)})
            else:
                self._add({"role": "system", "content": system})
                self._add({"role": "user", "content": await self._screened(task)})

        return await self._run(task, resumed=resume is not None, begin=begin)

    async def resume(self, state: ResumeState, *, fresh_budget: bool = False) -> list[Checkpoint]:
        """Take up an earlier run in this fresh sandbox, without running the agent.

        ``run(resume=...)`` does this first; a front end may call it and then :meth:`continue_with`. What
        is taken up: the conversation (calls it cut off answered), what it spent (``fresh_budget``: see
        :meth:`run`), its snapshots, made again so :meth:`undo` reaches them, and its workspace patch.

        Returns the snapshots that could not be made again (undo before them is refused, saying so).
        Raises :class:`WorkspaceCheckpointError` when the patch does not apply (the conversation is taken up).
        """
        self.messages = [dict(m) for m in state.messages]
        self._close_interrupted_calls()
        if fresh_budget:
            self._spent_before = state
        else:
            self.budget.steps, self.budget.tokens = state.steps, state.tokens
            self.budget.elapsed_before_s = state.elapsed_s
        self._last_patch, self._workspace_known = state.patch, False
        lost = await self.checkpoints.rebuild(state.checkpoints) if self.checkpoints is not None else []
        await restore_workspace(self.sandbox, state.patch)
        self._workspace_known = True
        return lost

    async def continue_with(self, text: str, *, screened: bool = False) -> RunResult:
        """A new request in the same conversation and sandbox, after a run ended (e.g. after
        ``finish``): ``text`` is the user's message; runs until it ends like :meth:`run`.
        ``screened``: ``text`` went through :meth:`screened` already (a message sent during the
        last run that it did not read), so the hooks do not run on it again."""

        async def begin() -> None:
            self._add(
                {"role": "user", "content": self._request(text) if screened else await self._screened(text)}
            )

        return await self._run(text, resumed=True, begin=begin)

    async def screened(self, text: str) -> str:
        """``text``, a person's request, once the UserPromptSubmit hooks have seen it, with the context
        they add; raises :class:`PromptBlocked` saying why when one blocked it (a front end that
        sends a message to a running or paused run with :meth:`send` screens it here first, and
        sends nothing when it is blocked)."""
        if self.hooks is None or not self.hooks.any("UserPromptSubmit"):
            return text
        verdict = await self.hooks.user_prompt_submit(text)
        if verdict.blocked is not None:
            raise PromptBlocked(verdict.blocked)
        if verdict.context:
            text += f"\n\n[Context from a UserPromptSubmit hook:]\n{verdict.context}"
        return text

    async def _screened(self, text: str) -> str:
        """A person's request as the model reads it (:meth:`screened`, then :meth:`_request`): a block
        ends the run before the model reads anything (the request is not added to the conversation)."""
        return self._request(await self.screened(text))

    def _request(self, text: str) -> str:
        """A person's request as the model reads it (in plan mode, with :data:`PLAN_NOTE`)."""
        return PLAN_NOTE + text if self.planning else text

    def send(self, text: str) -> None:
        """Add a user message to the running conversation; the model reads it at the next step
        boundary (after the calls of the current turn), or at once when paused by an interrupt.
        It is read as given: a person's message goes through :meth:`screened` first."""
        self.steering.send(text)

    def interrupt(self, message: str | None = None) -> bool:
        """Stop the model call or tool call under way at once; the interrupt is recorded in the
        conversation and the agent waits for a user message (``message``, or the next :meth:`send`)
        before going on. The run does not end. False when no call was under way (a running agent
        still waits for a message before its next model call; an idle one ignores it)."""
        return self.running and self.steering.interrupt(message)

    def answer_approval(self, call_id: str, answer: Answer | str, feedback: str = "") -> bool:
        """Answer the approval request of ``call_id`` (once / always / deny; a denial may say what to
        do instead: ``feedback``, which the model reads with the refusal); False when none waits."""
        return self.approvals is not None and self.approvals.answer(call_id, answer, feedback)

    async def undo(self, step: int) -> Checkpoint | None:
        """Put the workspace back as it was when ``step`` began (through the run's checkpoints) and
        tell the model what was undone. Only while no call is under way (between runs, or paused
        after an interrupt). None when nothing changed since ``step``."""
        if self.checkpoints is None:
            raise UsageError("this agent takes no checkpoints, so it cannot undo")
        if self.steering.busy:
            raise UsageError("the agent is running a call: interrupt it before undoing")
        undone = [c for c in self.checkpoints.taken if c.turn >= step]
        checkpoint = await self.checkpoints.undo_to(step)
        if checkpoint is None:
            return None
        self.tool_context.edit_history.clear()  # the editor's undo history is of the undone files
        what = ", ".join(f"step {c.turn} {c.tool}" for c in undone)
        self.bus.emit(WorkspaceUndone(step=step, ref=checkpoint.ref, commit=checkpoint.commit, undone=what))
        self._add(
            {
                "role": "user",
                "content": f"[The user undid the changes made since step {step} began ({what}): the "
                "workspace is back as it was then. Read the files again before relying on what you saw "
                "of them since.]",
            }
        )
        await self._record_workspace(self.next_step - 1, "")
        return checkpoint

    # -- the run -------------------------------------------------------------------------------------

    async def _run(self, task: str, *, resumed: bool, begin: Any) -> RunResult:
        if self.running:
            raise UsageError("the agent is already running")
        self.running = True
        self.steering.resume()  # the request is the user's message: nothing more to wait for
        self.budget.resume()
        self.bus.emit(
            RunStarted(
                run_id=self.run_id,
                task=task,
                backend=self.backend.name,
                tools=self.tool_specs,
                limits=self.budget.limits(),
                resumed=resumed,
            )
        )
        try:
            await begin()
            while True:
                try:
                    await self._step()
                except (Submitted, Answered) as ending:
                    if not await self._sent_back(ending):
                        raise
        except Submitted as done:
            result = RunResult("submitted", ExitCode.OK, "the agent finished the task", summary=done.summary)
        except Answered:
            result = RunResult("answered", ExitCode.OK, "the agent answered")
        except Planned as planned:
            result = RunResult(
                "planned",
                ExitCode.OK,
                "the agent proposed a plan",
                summary=planned.plan.summary,
                plan=planned.plan,
            )
        except PromptBlocked as exc:
            result = RunResult("error", exc.exit_code, exc.message, blocked=exc.reason)
        except LimitsExceeded as exc:
            result = RunResult("budget_exhausted", exc.exit_code, exc.message)
        except AgentStuck as exc:
            result = RunResult("stuck", exc.exit_code, exc.message)
        except RUN_ERRORS as exc:
            result = RunResult("error", exit_code_for(exc), message_of(exc))
        except (asyncio.CancelledError, KeyboardInterrupt):
            await self._finish(RunResult("interrupted", ExitCode.INTERRUPTED, "interrupted"))
            raise
        except Exception as exc:
            # An error no layer expected (a bug, or input nothing guarded against): the run still
            # ends with its Done, so a front end that goes on (the TUI) can run the next request;
            # the error itself reaches the caller.
            unexpected = f"the run stopped on an unexpected error: {type(exc).__name__}: {exc}"
            try:
                await self._finish(RunResult("error", ExitCode.FAILURE, unexpected))
            finally:
                self.running = False
            raise
        return await self._finish(result)

    async def _sent_back(self, ending: Submitted | Answered) -> bool:
        """Run the Stop hooks as the agent would stop; True when one sent it back to work (its
        words are then the user's next message)."""
        if self.hooks is None:
            return False
        outcome = "submitted" if isinstance(ending, Submitted) else "answered"
        summary = (
            ending.summary if isinstance(ending, Submitted) else str(self.messages[-1].get("content", ""))
        )
        hooks = self.hooks
        try:
            verdict = await self.steering.interruptible(lambda: hooks.stop(outcome, summary))
        except Interrupted:  # the person stopped the hooks: the agent stops as it meant to
            return False
        if verdict.send_back is None:
            return False
        self._add({"role": "user", "content": f"[A stop hook sent you back to work:]\n{verdict.send_back}"})
        return True

    async def _finish(self, result: RunResult) -> RunResult:
        self.result = result  # also when the run is interrupted, whose caller gets an exception
        self.running = False
        self.budget.pause()  # until the next request: waiting for a person is not the agent's time
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
        if not result.ended_well:
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
                plan=result.plan.to_dict() if result.plan is not None else None,
            )
        )
        await self.bus.drain()
        return result

    def _add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.bus.emit(MessageAdded(message=message))

    def _answer(self, call: ToolCall, content: str) -> None:
        self._add({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content})

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
                name = call["function"]["name"]
                self._add(
                    {"role": "tool", "tool_call_id": call["id"], "name": name, "content": INTERRUPTED_CALL}
                )

    @property
    def next_step(self) -> int:
        """The number of the next model step (steps count on across requests and resumes)."""
        return self._spent_before.steps + self.budget.steps + 1

    async def _step(self) -> None:
        for text in await self.steering.take_messages(self._waiting_for_user):
            self._add({"role": "user", "content": text})
        step = self.next_step
        # One count per step: the condenser reuses it, and a condensation reports its new size.
        prompt_tokens = self.model.count(self.messages)
        condensation = self.model.condense(step, self.messages, prompt_tokens)
        if condensation is not None:
            self.messages, prompt_tokens = condensation.messages, condensation.tokens_after
        for resource, used, limit in self.budget.check(prompt_tokens):
            self.bus.emit(BudgetWarning(resource=resource, used=used, limit=limit))
        if self.steering.paused:  # interrupted between calls: wait for the user before asking the model
            return
        self.bus.emit(
            ModelCallStarted(step=step, prompt_tokens=prompt_tokens, prompt_messages=len(self.messages))
        )
        asked = time.monotonic()
        try:
            turn, self.messages = await self.steering.interruptible(
                lambda: self.model.complete(step, self.messages)
            )
        except Interrupted:
            self.bus.emit(CallInterrupted(step=step, during="model"))
            self._add({"role": "user", "content": INTERRUPTED_REPLY})
            return
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
                forwards=turn.forwards,
                seconds=round(time.monotonic() - asked, 3),
            )
        )
        self._add(turn.to_message())
        problem = turn.format_error
        if problem is None and not turn.tool_calls:
            if self.conversation and turn.finish_reason != "length" and turn.content.strip():
                raise Answered()
            problem = CUT_OFF if turn.finish_reason == "length" else NO_TOOL_CALL
        if problem is not None:
            self.bus.emit(ErrorReported(kind="format", message=problem))
            self._add({"role": "user", "content": problem})
            self._nudge(self.stuck.observe(error=problem))
            return
        for call in turn.tool_calls:
            if self.steering.paused:  # interrupted during an earlier call of this turn
                self._answer(call, NOT_RUN)
            else:
                await self._call(step, call)

    def _waiting_for_user(self, waiting: bool) -> None:
        self.waiting_for_user = waiting
        if waiting:
            self.budget.pause()
        else:
            self.budget.resume()

    # -- one tool call -------------------------------------------------------------------------------

    async def _call(self, step: int, call: ToolCall) -> None:
        outcome = await self.caller.call(step, call)
        result = outcome.result
        self._answer(call, result.output)
        if SANDBOX_LOST in result.data:  # every later call would fail the same way
            raise SandboxError(
                f"the sandbox stopped working during the {call.name} call: {result.data[SANDBOX_LOST]}"
            )
        if outcome.may_have_changed:
            await self._record_workspace(step, call.id)
        if outcome.out_of_time:  # cut at the budget's end: the run ends here
            raise LimitsExceeded(self.budget.time_message(f"the {call.name} call"))
        if result.ends_task:
            raise Submitted(str(result.data.get("summary", "")))
        plan = result.data.get(PLAN_DATA)
        if result.ok and isinstance(plan, dict):
            self._planned(step, call, plan)
        if not outcome.interrupted:
            self._nudge(self.stuck.observe((call.name, call.arguments), None if result.ok else result.output))

    def _planned(self, step: int, call: ToolCall, data: dict[str, Any]) -> None:
        """A plan tool's result: in plan mode a proposal ends the turn; otherwise the steps it gives
        are the plan's progress (a proposal outside plan mode is taken as the plan to track)."""
        if call.name == "propose_plan" and self.planning:
            plan = Plan.from_dict(data)
            self.bus.emit(PlanUpdated(stage="proposed", plan=plan.to_dict(), step=step))
            raise Planned(plan)
        self.plan = (
            self.plan.with_statuses(data["steps"]) if self.plan else Plan.from_dict({"summary": "", **data})
        )
        self.bus.emit(PlanUpdated(stage="progress", plan=self.plan.to_dict(), step=step))

    async def _record_workspace(self, step: int, call_id: str) -> None:
        """Record the workspace diff when a call changed it: the trajectory then always holds the
        state to resume from, even if the run is interrupted or killed before its end. After a
        call (``call_id``), the checkpoints look first: nothing runs in the sandbox when its
        fingerprint says the workspace is unchanged, and otherwise one script both commits the
        changed workspace and reads its diff."""
        try:
            patch = None
            if call_id and self.checkpoints is not None:
                look = await self.checkpoints.look(with_diff=True)
                if not look.changed:
                    return
                patch = look.patch
            if patch is None:
                patch = await self.sandbox.diff()
        except WorkspaceDiffError as exc:  # the sandbox lives: the run goes on without this record
            self.bus.emit(
                ErrorReported(
                    kind="workspace",
                    message=f"{exc.message[:500]} (the trajectory keeps the last recorded diff)",
                )
            )
            return
        except OSError as exc:
            raise SandboxError(f"the workspace diff could not be read: {exc}") from exc
        if patch != self._last_patch:
            self._last_patch = patch
            self.bus.emit(WorkspaceChanged(step=step, call_id=call_id, patch=patch))

    def _nudge(self, message: str | None) -> None:
        if message is not None:
            self.bus.emit(ErrorReported(kind="stuck", message=message))
            self._add({"role": "user", "content": message})
