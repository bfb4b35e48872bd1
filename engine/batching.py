"""``BatchEngine``: many generation calls on one loaded model at once (what ``clover-agent serve`` runs).

Each request runs the decoding loop of :meth:`Engine.stream` in a greenlet of the scheduler's thread;
every model forward it needs is parked, and once each running request has parked one the scheduler runs
them all as one step (``CloverModel.forward_packed`` where the model has it) and wakes them. A
request joins between steps, leaves when it is done, and a cancelled one stops at its next forward
(as does one its reader finished early, e.g. at a stop string: counted as finished, not cancelled).
How it works and what it guarantees (greedy tokens as decoded alone): docs/decoding.md, "Batched
decoding".
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import greenlet
import torch

from clover_agent.engine.decoding.decoder import BlockDecoder, DecodeCall
from clover_agent.engine.decoding.prefix_cache import PrefixCache
from clover_agent.engine.decoding.sampling import GenerationResult, SamplingParams
from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone, StreamEvent
from clover_agent.engine.engine import Engine
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.network import AttentionRule, CloverModel
from clover_agent.engine.model.packed import Segment

log = logging.getLogger("clover_agent.engine.batching")

#: Prompt tokens a request prefills per step while others decode (whole blocks).
DEFAULT_PREFILL_CHUNK = 512
#: First messages remembered as not kept by the prefix cache (``BatchEngine._unkept``).
UNKEPT_REMEMBERED = 256


#: A share key: (mode, attention rule, length, digest of the tokens) (``BatchRequest.share_key``).
ShareKey = tuple[str, str, int, bytes]


def _share_key(call: DecodeCall, length: int) -> ShareKey:
    """The key of ``call``'s prompt up to ``length`` with the state it computes: calls with the
    same key compute the same state there (its mode, and the attention rule its prefill uses)."""
    params = call.params
    attention = "causal" if params.mode != "diffusion" or params.causal_context else "block"
    digest = hashlib.blake2b(array.array("q", call.prompt[:length]).tobytes()).digest()
    return params.mode, attention, length, digest


class QueueFull(RuntimeError):
    """The queue of waiting requests is full; ``retry_after``: seconds worth waiting before trying again."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestCancelled(RuntimeError):
    """The request was cancelled (by :meth:`BatchRequest.cancel` or a close without draining)."""


class EngineClosed(RuntimeError):
    """The batch engine takes no more requests (it is draining or closed)."""


class _Finished(Exception):  # a signal, not an error: it never leaves the engine
    """Raised in a request's greenlet at its next forward after :meth:`BatchRequest.finish`."""


@dataclass
class PendingForward(Segment):
    """One request's forward, waiting for the next packed step: a segment of ``forward_packed``
    (the arguments of ``CloverModel.forward``) and, once the step ran, its outcome."""

    result: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass(frozen=True)
class BatchStats:
    """A snapshot of the engine's counters (for ``/metrics`` and logs)."""

    queued: int
    running: int
    finished: int
    cancelled: int
    failed: int
    steps: int  # packed forwards run
    forwards: int  # request forwards in them
    tokens_forwarded: int  # tokens through the model in them
    generated_tokens: int  # tokens committed as output
    running_cache_bytes: int  # committed state of the running requests
    prefix_cache_bytes: int
    prefix_cache_entries: int
    max_running: int
    max_queued: int
    #: Requests that waited for another to compute the first message they share, then started from it.
    held_for_share: int = 0

    @property
    def forwards_per_step(self) -> float:
        return self.forwards / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_forwarded / self.steps if self.steps else 0.0


class BatchRequest:
    """One submitted call: its events (read them with :meth:`events` or :meth:`aevents`, from any
    number of readers), its result, and :meth:`cancel`."""

    def __init__(self, batch: BatchEngine, number: int, call: DecodeCall) -> None:
        self.id = f"req-{number}"
        self.batch = batch
        self.call = call
        self.submitted = time.monotonic()
        #: When the request started running and when its first block was committed (monotonic).
        self.started: float | None = None
        self.first_block: float | None = None
        self.finished: float | None = None
        self._events: list[StreamEvent] = []
        self._ended = False
        self._error: BaseException | None = None
        self._result: GenerationResult | None = None
        self._cancelled = False
        self._finishing = False
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.parked: PendingForward | None = None
        #: The greenlet the request's decoding loop runs in (on the scheduler's thread).
        self.task: greenlet.greenlet | None = None
        #: The cache its forwards run on, and its bytes (spare K/V capacity included: fixed per cache).
        self.cache: ModelCache | None = None
        self.cache_bytes = 0
        #: Its first share point (``DecodeCall.share_points``: the tools' part of the system prompt)
        #: and a key for its prompt up to there with its mode and attention rule (a digest: the key
        #: is hashed at every scheduler step): requests with the same key wait while one of them
        #: computes that state, then start from it.
        points = call.share_points()
        share = points[0] if points else 0
        self.share_at = share
        self.share_key = _share_key(call, share) if share else None
        #: Whether the prefix cache had a state of its own at or past ``share_at`` (None: not asked).
        self.own_state: bool | None = None
        self.held = False  # it waited for another request to compute that state
        self.held_for: str | None = None  # the id of the request it waited for

    # ---- reading -----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._ended

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def finishing(self) -> bool:
        """:meth:`finish` was called (the request ends, or ended, as finished)."""
        return self._finishing

    def events(self, timeout: float | None = None) -> Iterator[StreamEvent]:
        """The call's events as they come, ending with ``GenerationDone``; raises
        :class:`RequestCancelled` after a cancel, the decoding error after a failure, and
        ``TimeoutError`` when no event comes within ``timeout`` seconds."""
        index = 0
        while True:
            with self._cond:
                if not self._cond.wait_for(self._has_events_after(index), timeout):
                    raise TimeoutError(f"{self.id}: no event within {timeout} s")
                fresh = self._events[index:]
                ended, error = self._ended, self._error
            index += len(fresh)
            yield from fresh
            if ended and index >= len(self._events):
                if error is not None:
                    raise error
                return

    def _has_events_after(self, index: int) -> Callable[[], bool]:
        return lambda: index < len(self._events) or self._ended

    async def aevents(self) -> AsyncIterator[StreamEvent]:
        """:meth:`events` for asyncio: waits without a thread; closing the iterator does not cancel
        the request (call :meth:`cancel` for that)."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        waiter = (loop, wake)
        with self._cond:
            self._waiters.append(waiter)
        index = 0
        try:
            while True:
                with self._cond:
                    fresh = self._events[index:]
                    ended, error = self._ended, self._error
                    wake.clear()
                index += len(fresh)
                for event in fresh:
                    yield event
                if ended:
                    with self._cond:
                        rest = self._events[index:]
                    for event in rest:
                        yield event
                    if error is not None:
                        raise error
                    return
                if not fresh:
                    await wake.wait()
        finally:
            with self._cond:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def result(self, timeout: float | None = None) -> GenerationResult:
        """The call's result once it ends (raises as :meth:`events` does)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._ended, timeout):
                raise TimeoutError(f"{self.id}: not done within {timeout} s")
            if self._error is not None:
                raise self._error
            assert self._result is not None
            return self._result

    def cancel(self) -> None:
        """Stop this request: a queued one never runs, a running one stops before its next forward and
        its state is freed. No other request is affected. Idempotent; a finished request stays finished."""
        self.batch._cancel(self)

    def finish(self) -> None:
        """End this request now as a normal completion: its reader has all it asked for (``serve``:
        a stop string was written). A running one stops before its next forward (a forward already
        running may still commit a block); its ``GenerationDone`` carries the tokens committed so
        far with ``finish_reason`` "stop", and it counts as finished, never as cancelled (a later
        :meth:`cancel` changes nothing). Idempotent; an ended request stays as it ended."""
        self.batch._finish(self)

    # ---- writing (the scheduler's thread) ------------------------------------------------------
    def _push(self, event: StreamEvent) -> None:
        with self._cond:
            if isinstance(event, BlockCommitted) and self.first_block is None:
                self.first_block = time.monotonic()
            if isinstance(event, GenerationDone):
                self._result = event.result
            self._events.append(event)
            self._cond.notify_all()
            self._wake_async()

    def _end(self, error: BaseException | None) -> None:
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._error = error
            self.finished = time.monotonic()
            self.parked = None
            self.cache = None  # a reader may keep the request: not its state
            self._cond.notify_all()
            self._wake_async()

    def _wake_async(self) -> None:
        for loop, wake in list(self._waiters):
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the reader's loop is closed
                pass


class _BatchedCall(DecodeCall):
    """A decode call whose forwards wait for the batch's next packed step."""

    request: BatchRequest

    def forward(
        self,
        tokens: Sequence[int],
        cache: ModelCache,
        attention: AttentionRule,
        commit: bool | int = False,
        *,
        logit_rows: int | None = None,
        causal_prefix: int = 0,
    ) -> torch.Tensor:
        self._count_forward()
        pending = PendingForward(list(tokens), cache, attention, commit, causal_prefix, logit_rows)
        return self.request.batch._park(self.request, pending)


@dataclass
class _Counters:
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    steps: int = 0
    forwards: int = 0
    tokens_forwarded: int = 0
    generated_tokens: int = 0
    held_for_share: int = 0
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=64))


class BatchEngine:
    """Runs up to ``max_running`` requests together on ``engine``'s model; up to ``max_queued`` more
    wait (a further one is :class:`QueueFull`)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_running: int = 8,
        max_queued: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefix_cache: PrefixCache | None = None,
        packed: bool = True,
    ) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1 (got {max_running})")
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0 (got {max_queued})")
        self.engine = engine
        self.model: CloverModel = engine.model
        self.max_running = max_running
        self.max_queued = max_queued
        #: Run each step's forwards as one packed forward (``forward_packed``) where the model can.
        self.packed = packed and hasattr(self.model, "forward_packed")
        self.prefix_cache = prefix_cache if prefix_cache is not None else engine.prefix_cache
        self.decoder = BlockDecoder(
            engine.model, engine.tokenizer, self.prefix_cache, choice=engine.decoder.choice
        )
        block = engine.config.block_size
        self.decoder.prefill_chunk = max(block, prefill_chunk // block * block)
        self._cond = threading.Condition()
        self._queue: deque[BatchRequest] = deque()
        self._running: list[BatchRequest] = []
        self._numbers = itertools.count(1)
        self._counters = _Counters()
        #: The first messages (share keys) being computed now, by the request computing each.
        self._sharing: dict[ShareKey, BatchRequest] = {}
        #: First messages whose state the prefix cache did not keep (over its budget): requests with
        #: them are not held back again, which would only make them compute it one after another.
        self._unkept: OrderedDict[ShareKey, None] = OrderedDict()
        self._accepting = True
        self._stopping = False
        self._hub: greenlet.greenlet | None = None
        self._scheduler = threading.Thread(target=self._schedule, name="clover-batch", daemon=True)
        self._scheduler.start()

    # ---- public ------------------------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return self._accepting

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> BatchRequest:
        """Queue a call. Bad parameters or prompt (``ValueError``) are raised here, as are
        :class:`QueueFull` and :class:`EngineClosed`."""
        params = params if params is not None else self.engine.default_params()
        call = _BatchedCall(self.decoder, list(prompt_ids), params)
        request = BatchRequest(self, next(self._numbers), call)  # its share key: not under the lock
        call.request = request
        with self._cond:
            if not self._accepting:
                raise EngineClosed("the engine is shutting down and takes no new requests")
            if len(self._running) + len(self._queue) >= self.max_running + self.max_queued:
                raise QueueFull(
                    f"{len(self._running) + len(self._queue)} requests are running or waiting (the limit: "
                    f"{self.max_running} running, {self.max_queued} waiting)",
                    retry_after=self._retry_after(),
                )
            self._queue.append(request)
            self._cond.notify_all()
        return request

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> GenerationResult:
        """Submit and wait for the result."""
        return self.submit(prompt_ids, params).result()

    def stats(self) -> BatchStats:
        with self._cond:
            c = self._counters
            running_bytes = sum(r.cache_bytes for r in self._running)
            queued, running = len(self._queue), len(self._running)
        return BatchStats(
            queued=queued,
            running=running,
            finished=c.finished,
            cancelled=c.cancelled,
            failed=c.failed,
            steps=c.steps,
            forwards=c.forwards,
            tokens_forwarded=c.tokens_forwarded,
            generated_tokens=c.generated_tokens,
            running_cache_bytes=running_bytes,
            prefix_cache_bytes=self.prefix_cache.nbytes if self.prefix_cache is not None else 0,
            prefix_cache_entries=len(self.prefix_cache) if self.prefix_cache is not None else 0,
            max_running=self.max_running,
            max_queued=self.max_queued,
            held_for_share=c.held_for_share,
        )

    def close(self, *, drain: bool = True, timeout: float | None = None) -> bool:
        """Take no new requests; with ``drain`` let the queued and running ones finish, else cancel
        them. Returns whether everything ended within ``timeout`` seconds."""
        with self._cond:
            self._accepting = False
            doomed = [] if drain else list(self._queue) + list(self._running)
        for request in doomed:
            self._cancel(request)
        with self._cond:
            ended = self._cond.wait_for(lambda: not self._queue and not self._running, timeout)
            if ended:
                self._stopping = True
                self._cond.notify_all()
        if ended:
            self._scheduler.join(timeout)
        return ended

    # ---- the requests' side (each in a greenlet of the scheduler's thread) -------------------------
    def _park(self, request: BatchRequest, pending: PendingForward) -> torch.Tensor:
        """Hand ``pending`` to the scheduler and wait (in the request's greenlet) for its step."""
        if request.cancelled:
            raise RequestCancelled(f"{request.id} was cancelled")
        if request.finishing:
            raise _Finished
        request.parked = pending
        if pending.cache is not request.cache:  # sized once per cache, not at every forward
            request.cache, request.cache_bytes = pending.cache, pending.cache.nbytes()
        assert self._hub is not None
        self._hub.switch()
        if request.cancelled and not pending.done:
            raise RequestCancelled(f"{request.id} was cancelled")
        if request.finishing and not pending.done:
            raise _Finished
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _run_request(self, request: BatchRequest) -> None:
        error: BaseException | None = None
        try:
            request.call.started = time.perf_counter()
            for event in self.decoder.run(request.call):
                request._push(event)
                if isinstance(event, BlockCommitted):
                    with self._cond:
                        self._counters.generated_tokens += len(event.token_ids)
        except _Finished:  # its reader has what it asked for: a normal end
            request._push(GenerationDone(request.call.result("stop")))
        except BaseException as exc:  # the request's own failure, handed to its readers
            error = exc
            if not isinstance(exc, RequestCancelled):
                log.warning("%s failed: %s: %s", request.id, type(exc).__name__, exc)
        request._end(error)
        with self._cond:
            self._running.remove(request)
            if request.share_key is not None and self._sharing.get(request.share_key) is request:
                del self._sharing[request.share_key]
            c = self._counters
            if error is None:
                c.finished += 1
                if request.started is not None and request.finished is not None:
                    c.durations.append(request.finished - request.started)
            elif isinstance(error, RequestCancelled):
                c.cancelled += 1
            else:
                c.failed += 1
            self._cond.notify_all()

    def _cancel(self, request: BatchRequest) -> None:
        if self._stop(request, finish=False):
            request._end(RequestCancelled(f"{request.id} was cancelled before it started"))

    def _finish(self, request: BatchRequest) -> None:
        if self._stop(request, finish=True):  # nothing was asked of it: an empty answer
            request._push(GenerationDone(request.call.result("stop")))
            request._end(None)

    def _stop(self, request: BatchRequest, *, finish: bool) -> bool:
        """Mark ``request`` finishing or cancelled (once: a later stop of either kind changes nothing)
        and take it out of the queue; returns whether it was queued, for the caller to end it. A
        running one is resumed with the stop by the scheduler."""
        with self._cond:
            if request.done or request._cancelled or request._finishing:
                return False
            if finish:
                request._finishing = True
            else:
                request._cancelled = True
            queued = request in self._queue
            if queued:
                self._queue.remove(request)
                if finish:
                    self._counters.finished += 1
                else:
                    self._counters.cancelled += 1
            self._cond.notify_all()
        return queued

    def _retry_after(self) -> float:
        durations = self._counters.durations
        typical = sorted(durations)[len(durations) // 2] if durations else 1.0
        return max(1.0, round(typical, 1))

    # ---- the scheduler -----------------------------------------------------------------------
    def _schedule(self) -> None:
        """The scheduler thread: resumes each running request's greenlet until it parks a forward
        (or ends), runs the parked forwards as one step, and again. Nothing of a request runs
        outside this thread, so a step needs no hand-off between threads."""
        self._hub = greenlet.getcurrent()
        while True:
            with self._cond:
                while not self._running and not self._queue:
                    if self._stopping:
                        return
                    self._cond.wait()
                cancelled = [
                    r for r in self._running if (r.cancelled or r.finishing) and r.parked is not None
                ]
            self._admit()
            for request in cancelled:  # resumed at their park: RequestCancelled, or the finish
                request.parked = None
                self._resume(request)
            with self._cond:
                batch = [r for r in self._running if r.parked is not None]
            if not batch:
                continue
            pending = [r.parked for r in batch if r.parked is not None]
            self._run_step(pending)
            for request in batch:
                request.parked = None
                self._resume(request)

    def _admit(self) -> None:
        """Start queued requests while there is room, in order, past those that wait for a shared
        first message; each runs until its first forward is parked (or it ends). One whose first
        forward computes a first message others may share is noted as computing it."""
        while True:
            with self._cond:
                if len(self._running) >= self.max_running:
                    return
                request = next((r for r in self._queue if not self._waits_for_share(r)), None)
                if request is None:
                    return
                self._queue.remove(request)
                self._counters.held_for_share += request.held
                request.started = time.monotonic()
                self._running.append(request)
            request.task = greenlet.greenlet(lambda r=request: self._run_request(r))
            request.task.switch()
            with self._cond:
                key = request.share_key
                if key is not None and key not in self._unkept and self._computing_share(request):
                    self._sharing.setdefault(key, request)

    @staticmethod
    def _computing_share(request: BatchRequest) -> bool:
        """Whether ``request`` is still prefilling its prompt short of its share point (a prefill
        forward commits and asks for no logits)."""
        parked = request.parked
        return (
            not request.done
            and parked is not None
            and parked.logit_rows == 0
            and request.cache is not None
            and request.cache.length < request.share_at
        )

    def _waits_for_share(self, request: BatchRequest) -> bool:
        """Whether ``request`` should wait: another running request is computing the state of the
        first message they share (its prefill has not passed it yet); once it has, the state is in
        the prefix cache and the request starts from it instead of computing it again."""
        key = request.share_key
        if key is None:
            return False
        owner = self._sharing.get(key)
        if owner is None or owner is request:
            return False
        if not self._computing_share(owner):
            del self._sharing[key]
            passed = owner.cache is not None and owner.cache.length >= owner.share_at
            shared = owner.call.prompt[: owner.share_at]
            if passed and (self.prefix_cache is None or not self.prefix_cache.holds(shared, key[1])):
                self._unkept[key] = None
                while len(self._unkept) > UNKEPT_REMEMBERED:
                    self._unkept.popitem(last=False)
            return False
        if request.own_state is None:  # a later turn of a conversation: its own state is cached
            request.own_state = self._has_own_state(request)
        if request.own_state:
            return False
        if request.held_for not in (None, owner.id):  # the one it waited for gave the part up
            return False  # waits once: never again behind each of a client's cancelled requests
        request.held, request.held_for = True, owner.id
        return True

    def _has_own_state(self, request: BatchRequest) -> bool:
        """Whether the prefix cache holds a state ``request`` will start from (under its attention
        rule, in whole blocks short of its last token) at or past its share point."""
        if self.prefix_cache is None or request.share_key is None:
            return False
        prompt, size = request.call.prompt, request.call.block_size
        usable = (len(prompt) - 1) // size * size
        if usable < request.share_at:
            return False
        attention = request.share_key[1]
        return self.prefix_cache.holds(
            prompt[:usable], attention, at_least=request.share_at, multiple_of=size
        )

    def _resume(self, request: BatchRequest) -> None:
        task = request.task
        if task is not None and not task.dead:
            task.switch()

    def _run_step(self, pending: list[PendingForward]) -> None:
        error: BaseException | None = None
        outputs: list[torch.Tensor] = []
        try:
            if self.packed and len(pending) > 1:
                outputs = self.model.forward_packed(pending)
            else:
                outputs = [
                    self.model(
                        p.input_ids,
                        p.cache,
                        attention=p.attention,
                        commit=p.commit,
                        causal_prefix=p.causal_prefix,
                        logit_rows=p.logit_rows,
                    )
                    for p in pending
                ]
        except Exception as exc:  # every request of the step sees it: their caches may be mid-update
            error = exc
            log.warning("a batched step of %d forwards failed: %s: %s", len(pending), type(exc).__name__, exc)
        with self._cond:
            c = self._counters
            c.steps += 1
            c.forwards += len(pending)
            c.tokens_forwarded += sum(len(p.input_ids) for p in pending)
        for i, p in enumerate(pending):
            if error is not None:
                p.error = error
            else:
                p.result = outputs[i]
            p.done = True
