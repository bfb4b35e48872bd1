"""Typed events the agent loop emits, and the one bus every front end subscribes to.

The loop never prints or writes files itself: it emits events, and subscribers (the trajectory
writer, the console renderer of ``fix``, the TUI, the CI bot) turn them into output. The same events,
written as JSON Lines, are the trajectory and the state a run resumes from. The module is the
catalogue of every event type, which is also the trajectory's schema, so readers find an event's
fields in one place; :class:`EventBus` says in what order subscribers see them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: Event name (the ``type`` field in a trajectory line) to class.
EVENT_TYPES: dict[str, type[Event]] = {}


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event. ``time`` is wall-clock seconds since the epoch."""

    type: ClassVar[str] = "event"
    time: float = field(default_factory=time.time)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        EVENT_TYPES[cls.type] = cls

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from its ``to_dict()`` form (a trajectory line)."""
    values = dict(data)
    cls = EVENT_TYPES[values.pop("type")]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class TaskStarted(Event):
    """A front end's task begins (e.g. ``fix``), before any agent run: what was asked, and where."""

    type: ClassVar[str] = "task_started"
    run_id: str
    command: str
    target: str
    repo: str
    sandbox: str
    #: How the front end was started (backend and its options, sandbox, budgets), so a resumption
    #: can start it the same way without being told (``fix --resume``).
    launch: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TaskResumed(Event):
    """A stopped task continues (``fix --resume``), appending to the same trajectory: the boundary
    between two segments, with what ended the previous one."""

    type: ClassVar[str] = "task_resumed"
    run_id: str
    command: str
    segment: int  # 2 for the first resumption
    previous_exit_code: int | None  # None when the previous segment left no verdict (killed)
    previous_outcome: str  # the agent's outcome (budget_exhausted, interrupted, error, ...)
    previous_message: str
    repo: str
    sandbox: str
    launch: dict[str, Any] = field(default_factory=dict)  # how this segment was started (see TaskStarted)


@dataclass(frozen=True, kw_only=True)
class TestsRun(Event):
    """A test run made by the front end itself (not by the agent): before or after the agent's work."""

    __test__ = False  # not a pytest test class
    type: ClassVar[str] = "tests_run"
    phase: str  # e.g. target_before, suite_before, target_after, suite_after
    target: str
    report: dict[str, Any]
    chosen: str = ""  # target_before of fix: why these tests, in words ("" when TARGET named them)


@dataclass(frozen=True, kw_only=True)
class SandboxProgress(Event):
    """What a long sandbox start is doing: the project environment's set-up (what was found, each
    step, pip's latest line), the cached environment it starts from, a large copy."""

    type: ClassVar[str] = "sandbox_progress"
    message: str


@dataclass(frozen=True, kw_only=True)
class TaskFinished(Event):
    """A front end's task ended: its verdict (which may differ from the agent's ``Done``: ``fix``
    checks the tests after the agent finished) and the exit code the command ends with."""

    type: ClassVar[str] = "task_finished"
    run_id: str
    command: str
    exit_code: int
    message: str
    report: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PhaseStarted(Event):
    """A front end's long phase begins or moves on (``fix``: set-up, tests before, verification):
    what a live status shows until the next event. ``detail`` says what it does now."""

    type: ClassVar[str] = "phase_started"
    phase: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    """A run (or the resumption of one) begins."""

    type: ClassVar[str] = "run_started"
    run_id: str
    task: str
    backend: str
    tools: list[dict] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False


@dataclass(frozen=True, kw_only=True)
class ModelCallStarted(Event):
    """The model is asked for the turn of ``step``, with a prompt of ``prompt_tokens`` tokens."""

    type: ClassVar[str] = "model_call_started"
    step: int
    prompt_tokens: int
    prompt_messages: int


@dataclass(frozen=True, kw_only=True)
class PromptRefused(Event):
    """The backend refused the prompt of ``step`` before writing anything: its ``prompt_tokens``
    leave no room in the model's ``context_window``. The model call ``ModelCallStarted`` announced
    was not made; the loop condenses harder and asks once more (a ``ModelResponded`` of the same
    step), or the run ends."""

    type: ClassVar[str] = "prompt_refused"
    step: int
    prompt_tokens: int
    context_window: int


@dataclass(frozen=True, kw_only=True)
class ModelDelta(Event):
    """Streamed model text while it writes; ``kind`` is ``text`` or ``reasoning``."""

    type: ClassVar[str] = "model_delta"
    step: int
    kind: str
    text: str


@dataclass(frozen=True, kw_only=True)
class ProvisionalBlock(Event):
    """A block-diffusion block being denoised in the model call of ``step`` (engine backend): the
    fields of :class:`clover_agent.backends.base.BlockView` (nothing here is final)."""

    type: ClassVar[str] = "provisional_block"
    step: int
    block: int
    position: int
    denoise_step: int
    token_ids: list[int]
    filled: list[bool]
    newly_filled: list[int]
    text: str


@dataclass(frozen=True, kw_only=True)
class ModelResponded(Event):
    """One complete model turn, with the raw text exactly as the model wrote it."""

    type: ClassVar[str] = "model_responded"
    step: int
    raw: str
    content: str
    reasoning: str | None
    tool_calls: list[dict]
    format_error: str | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    prompt_messages: int = 0  # messages in the conversation the model was given
    forwards: int = 0  # model forward passes the turn took (engine backend; 0: not known)
    seconds: float = 0.0  # how long the model call took


@dataclass(frozen=True, kw_only=True)
class MessageAdded(Event):
    """A message appended to the conversation (the resume state is rebuilt from these)."""

    type: ClassVar[str] = "message_added"
    message: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ToolCallStarted(Event):
    type: ClassVar[str] = "tool_call_started"
    step: int
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ToolOutput(Event):
    """A piece of what the call ``call_id`` (a shell command, a test run) printed, while it runs:
    raw as printed (a display sanitises it), coalesced by the sandbox (at most a few a second; a
    piece may note bytes it skipped). For a live display only: its ``ToolCallFinished`` holds the
    whole output (an interrupted call's: what these pieces held), so the trajectory does not keep
    them unless asked to (``TrajectoryWriter(keep_stream=True)``), as for ``ModelDelta``."""

    type: ClassVar[str] = "tool_output"
    step: int
    call_id: str
    name: str
    text: str


@dataclass(frozen=True, kw_only=True)
class ToolCallFinished(Event):
    """A tool's result: ``output`` is what the model sees, ``full_output`` everything (untrimmed),
    ``data`` the tool's structured result less its ``output`` (that is ``full_output``)."""

    type: ClassVar[str] = "tool_call_finished"
    step: int
    call_id: str
    name: str
    output: str
    is_error: bool
    full_output: str = ""
    data: dict[str, Any] | None = None
    duration_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class WorkspaceChanged(Event):
    """The workspace diff after a mutating call changed it: where a resumed run restarts from,
    even when the run was interrupted or killed before it could read the diff at the end."""

    type: ClassVar[str] = "workspace_changed"
    step: int
    call_id: str
    patch: str


@dataclass(frozen=True, kw_only=True)
class ApprovalRequested(Event):
    """The policy says to ask about the call ``call_id``; emitted before the answer is awaited, so a
    front end answers it by that id (``Agent.answer_approval``)."""

    type: ClassVar[str] = "approval_requested"
    step: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    reason: str
    always: str = ""  # what an "always" answer would allow, for the question (policy.always_scope)


@dataclass(frozen=True, kw_only=True)
class ApprovalDecided(Event):
    """The decision on a call the policy did not simply allow."""

    type: ClassVar[str] = "approval_decided"
    step: int
    call_id: str
    name: str
    approved: bool
    decided_by: str  # policy, user, remembered (an earlier "always"), no-terminal
    reason: str
    answer: str | None = None  # the person's answer: once, always or deny (decided_by "user")
    feedback: str = ""  # with a denial: what the person said to do instead (the model reads it)


@dataclass(frozen=True, kw_only=True)
class CallInterrupted(Event):
    """A front end interrupted the model call (``during="model"``: its reply is discarded) or the
    tool call ``call_id`` (``during="tool"``: its processes were stopped) of ``step``."""

    type: ClassVar[str] = "call_interrupted"
    step: int
    during: str
    call_id: str = ""
    name: str = ""


@dataclass(frozen=True, kw_only=True)
class WorkspaceUndone(Event):
    """The workspace was put back as it was when ``step`` began (``Agent.undo``), from the
    checkpoint ``ref``/``commit``; ``undone`` names the calls whose changes are gone."""

    type: ClassVar[str] = "workspace_undone"
    step: int
    ref: str
    commit: str
    undone: str


@dataclass(frozen=True, kw_only=True)
class PlanUpdated(Event):
    """The agent's plan (``Plan.to_dict`` form): ``proposed`` in plan mode, ``approved`` (perhaps
    edited) by the person, ``progress`` from an ``update_plan`` call, ``dropped`` when plan mode
    was left without one."""

    type: ClassVar[str] = "plan_updated"
    stage: str
    plan: dict[str, Any]
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class CheckpointTaken(Event):
    """The workspace was snapshotted before a mutating call in ``turn`` (a model step)."""

    type: ClassVar[str] = "checkpoint_taken"
    turn: int
    ref: str
    commit: str
    tool: str


@dataclass(frozen=True, kw_only=True)
class ContextCondensed(Event):
    """Parts of the conversation were dropped to fit the window; ``messages`` is the new conversation."""

    type: ClassVar[str] = "context_condensed"
    step: int
    note: str
    dropped: list[str]
    tokens_before: int
    tokens_after: int
    messages: list[dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class BudgetWarning(Event):
    type: ClassVar[str] = "budget_warning"
    resource: str
    used: float
    limit: float


@dataclass(frozen=True, kw_only=True)
class ErrorReported(Event):
    """Something went wrong. ``fatal`` errors end the run; the others were fed back to the model."""

    type: ClassVar[str] = "error"
    kind: str
    message: str
    fatal: bool = False
    exit_code: int | None = None


@dataclass(frozen=True, kw_only=True)
class HookRan(Event):
    """One of the user's hooks ran (docs/hooks.md): on which ``hook_event`` (and tool call), what
    it ``decided`` (ok, deny, ask, modify, context, block, veto) or ``failed`` (a non-blocking
    failure: an exit code other than 0 and 2, a timeout, output that is not valid JSON; it changed
    nothing), why, and the tail of what it printed (made inert for a terminal)."""

    type: ClassVar[str] = "hook_ran"
    hook_event: str
    command: str
    origin: str  # settings | repository
    where: str  # host | sandbox
    exit_code: int | None  # None: killed at its timeout, or it could not start
    duration_s: float
    decided: str = "ok"
    failed: bool = False
    timed_out: bool = False
    reason: str = ""
    output_tail: str = ""
    call_id: str = ""
    tool: str = ""


@dataclass(frozen=True, kw_only=True)
class Done(Event):
    """The run ended. ``patch`` is the workspace diff at the end (resuming re-applies it); when the
    diff could not be read (an interrupt closes the sandbox) it is the last one recorded."""

    type: ClassVar[str] = "done"
    outcome: str
    exit_code: int
    message: str
    summary: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    patch: str = ""
    plan: dict[str, Any] | None = None  # a run that ended ``planned``: its plan


Subscriber = Callable[[Event], Awaitable[None] | None]


class _AsyncSubscription:
    """One async subscriber: its own queue and worker, so its events stay in order."""

    def __init__(self, callback: Callable[[Event], Awaitable[None]]) -> None:
        self.callback = callback
        self.queue: asyncio.Queue[Event] | None = None
        self.worker: asyncio.Task[None] | None = None
        self.errors: list[BaseException] = []

    def put(self, event: Event) -> None:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.worker = asyncio.get_running_loop().create_task(self._run())
        self.queue.put_nowait(event)

    async def _run(self) -> None:
        assert self.queue is not None
        while True:
            event = await self.queue.get()
            try:
                await self.callback(event)
            except Exception as exc:  # kept and re-raised by drain(): the loop must not die mid-step
                self.errors.append(exc)
            finally:
                self.queue.task_done()

    async def drain(self) -> None:
        if self.queue is not None:
            await self.queue.join()
        if self.errors:
            error, self.errors = self.errors[0], []
            raise error

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.cancel()


class EventBus:
    """Fan-out of events to subscribers.

    A subscriber is a plain callable or an ``async def``. Plain callables run inline, in emit
    order, so they see every event before the loop moves on (the trajectory writer relies on this).
    Async subscribers each get their own queue and worker task, so a slow one never reorders its
    events or blocks the loop; ``await bus.drain()`` waits until they have caught up."""

    def __init__(self) -> None:
        self._sync: list[Callable[[Event], None]] = []
        self._async: list[_AsyncSubscription] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns a function that removes it."""
        if inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(
            getattr(callback, "__call__", None)  # noqa: B004 - an object with an async __call__
        ):
            subscription = _AsyncSubscription(callback)  # type: ignore[arg-type]
            self._async.append(subscription)

            def unsubscribe_async() -> None:
                subscription.cancel()
                if subscription in self._async:
                    self._async.remove(subscription)

            return unsubscribe_async
        self._sync.append(callback)  # type: ignore[arg-type]

        def unsubscribe() -> None:
            if callback in self._sync:
                self._sync.remove(callback)

        return unsubscribe

    def emit(self, event: Event) -> None:
        """Deliver ``event``: sync subscribers now, async ones queued (needs a running event loop)."""
        for callback in list(self._sync):
            callback(event)
        for subscription in list(self._async):
            subscription.put(event)

    async def drain(self) -> None:
        """Wait until every async subscriber has handled every event emitted so far."""
        for subscription in list(self._async):
            await subscription.drain()

    async def close(self) -> None:
        """Drain, then stop the async subscribers' workers."""
        try:
            await self.drain()
        finally:
            for subscription in self._async:
                subscription.cancel()
