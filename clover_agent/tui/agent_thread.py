"""An asyncio loop in a daemon thread: where a TUI session's agent, sandbox and backend live.

The agent core is async, so it gets a loop of its own rather than a Textual thread worker (which
holds a plain function); a daemon thread cannot hold up the exit when a sandbox or a model call
hangs. The UI thread hands it coroutines and waits on the futures without blocking.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AgentThread:
    """An asyncio loop running in a daemon thread (see the module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="clover-tui-agent", daemon=True)
        self._thread.start()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def call(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the session is over
            pass

    def stop(self) -> None:
        self.call(self.loop.stop)
        self._thread.join(timeout=5)
