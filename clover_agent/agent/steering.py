"""Steering a running agent from a front end: user messages sent in, and interrupts.

A front end (the TUI) calls :meth:`Steering.send` and :meth:`Steering.interrupt` from its own
tasks on the agent's event loop. The loop runs each model call and tool call through
:meth:`Steering.interruptible`, so an interrupt cancels exactly that call (the backend hangs up or
stops its decoding thread; the sandbox kills the command's processes) and nothing else; and at each
step boundary it takes the messages sent so far with :meth:`Steering.take_messages`, which waits
for one after an interrupt (the user's correction) before the agent goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Interrupted(Exception):
    """The call was interrupted by :meth:`Steering.interrupt` (raised by :meth:`Steering.interruptible`)."""


class Steering:
    """User messages waiting for the next step boundary, and the call an interrupt would stop."""

    def __init__(self) -> None:
        self._inbox: list[str] = []
        self._arrived = asyncio.Event()
        self._current: asyncio.Task[Any] | None = None
        self._interrupting = False
        self._paused = False  # after an interrupt: wait for a message before going on

    @property
    def paused(self) -> bool:
        """Whether the agent stopped after an interrupt and waits for a user message."""
        return self._paused

    @property
    def busy(self) -> bool:
        """Whether a model call or tool call is under way."""
        return self._current is not None

    def send(self, text: str) -> None:
        """Queue a user message; the agent reads it at its next step boundary (at once when paused)."""
        self._inbox.append(text)
        self._arrived.set()

    def interrupt(self, message: str | None = None) -> bool:
        """Stop the call under way (if any) and pause before the next model call until a user message
        comes (``message``, when given, is that message). False when there was nothing to stop."""
        if message is not None:
            self.send(message)
        self._paused = True
        current = self._current
        if current is None or current.done():
            return False
        self._interrupting = True
        current.cancel()
        return True

    def resume(self) -> None:
        """Go on without waiting for a message (a new request brings its own)."""
        self._paused = False

    async def interruptible(self, work: Callable[[], Awaitable[T]]) -> T:
        """``await work()`` as the call an interrupt stops; raises :class:`Interrupted` when it did.
        Cancelling the awaiting task itself (Ctrl-C, a timeout) cancels the call as before."""
        task: asyncio.Task[T] = asyncio.ensure_future(work())
        self._current, self._interrupting = task, False
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self._interrupting and (me is None or me.cancelling() == 0):
                raise Interrupted() from None
            raise
        finally:
            self._current, self._interrupting = None, False

    async def take_messages(self, on_wait: Callable[[bool], None] | None = None) -> list[str]:
        """The messages sent since the last call, in order; while paused, waits for at least one.
        ``on_wait`` is told when a wait starts (True) and ends (False), e.g. to stop a clock."""
        if self._paused and not self._inbox:
            if on_wait is not None:
                on_wait(True)
            try:
                while not self._inbox:
                    self._arrived.clear()
                    await self._arrived.wait()
            finally:
                if on_wait is not None:
                    on_wait(False)
        self._paused = False
        messages, self._inbox = self._inbox, []
        self._arrived.clear()
        return messages
