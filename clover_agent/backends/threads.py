"""Blocking work (HTTP reads, model loading, decoding) run off the event loop in daemon threads.

Unlike ``asyncio.to_thread``, an abandoned daemon thread cannot hold up the interpreter's exit, so
an interrupted agent never waits for a socket read or a generation to finish.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()  # the producer thread is done


async def run_in_daemon_thread(work: Callable[[], T], *, name: str = "clover-backend") -> T:
    """The result of ``work()`` computed in a new daemon thread (its exception re-raised here)."""
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

    threading.Thread(target=run, daemon=True, name=name).start()
    return await future


async def iterate_in_daemon_thread(items: Callable[[], Iterable[T]], *, name: str) -> AsyncIterator[T]:
    """The items of ``items()``, produced in a new daemon thread and handed over as they come (its
    exception re-raised here). Once the consumer stops (close the iterator: ``contextlib.aclosing``),
    the thread stops after its next item."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            for item in items():
                call_soon(loop, queue.put_nowait, item)
                if stop.is_set():
                    break
        except BaseException as exc:
            failure.append(exc)
        call_soon(loop, queue.put_nowait, _END)

    threading.Thread(target=produce, daemon=True, name=name).start()
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
