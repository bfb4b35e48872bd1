"""Blocking work (HTTP reads, model loading, decoding) run off the event loop in daemon threads.

Unlike ``asyncio.to_thread``, an abandoned daemon thread cannot hold up the interpreter's exit, so
an interrupted agent never waits for a socket read or a generation to finish. A backend whose
threads run native code that must not be cut off at the interpreter's exit (torch: "terminate
called without an active exception", an abort) passes a :class:`BackendThreads` and waits for it in
its ``close()``: a stopped generation ends after its current step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()  # the producer thread is done


class BackendThreads:
    """The daemon threads one backend started, so that it can wait for them to end."""

    def __init__(self) -> None:
        self._alive: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, target: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                target()
            finally:
                with self._lock:
                    self._alive.discard(thread)

        thread = threading.Thread(target=run, daemon=True, name=name)
        with self._lock:
            self._alive.add(thread)
        thread.start()

    def alive(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._alive)

    async def wait(self, timeout_s: float) -> list[threading.Thread]:
        """Wait (without blocking the event loop) until every thread has ended or ``timeout_s``
        passed; the threads still running."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (left := self.alive()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return left


def _start(target: Callable[[], None], name: str, threads: BackendThreads | None) -> None:
    if threads is not None:
        threads.start(target, name)
    else:
        threading.Thread(target=target, daemon=True, name=name).start()


async def run_in_daemon_thread(
    work: Callable[[], T], *, name: str = "clover-backend", threads: BackendThreads | None = None
) -> T:
    """The result of ``work()`` computed in a new daemon thread (its exception re-raised here),
    kept in ``threads`` while it runs."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as exc:
            result, error = None, exc
        call_soon(loop, settle, result, error)

    _start(run, name, threads)
    return await future


async def iterate_in_daemon_thread(
    items: Callable[[], Iterable[T]], *, name: str, threads: BackendThreads | None = None
) -> AsyncGenerator[T, None]:
    """The items of ``items()``, produced in a new daemon thread (kept in ``threads`` while it
    runs) and handed over as they come (its exception re-raised here). Once the consumer stops
    (close the iterator: ``contextlib.aclosing``), the thread stops after its next item and closes
    ``items()``'s iterator."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            iterator = iter(items())
            try:
                for item in iterator:
                    call_soon(loop, queue.put_nowait, item)
                    if stop.is_set():
                        break
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()  # a generator's cleanup runs here, in this thread, now
        except BaseException as exc:
            failure.append(exc)
        call_soon(loop, queue.put_nowait, _END)

    _start(produce, name, threads)
    try:
        while (item := await queue.get()) is not _END:
            yield item
    finally:
        stop.set()
    if failure:
        raise failure[0]


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """Schedule ``callback`` on ``loop`` from another thread; a closed loop (nobody waits) is ignored."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass
