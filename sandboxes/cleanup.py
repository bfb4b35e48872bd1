"""Leaving nothing behind: close open sandboxes on SIGINT/SIGTERM and at exit, and tell stale
leftovers of killed runs (their owner process is gone) from live ones.

Each started sandbox registers a synchronous cleanup function. On SIGINT or SIGTERM the handler
runs every registered cleanup, then hands the signal to whatever handled it before (so Ctrl-C still
raises ``KeyboardInterrupt``, SIGTERM still ends the process with its status, and a Python handler
still runs). A signal the process ignores is left ignored. Handlers are installed on the first
registration, from the main thread only (Python delivers signals there). A SIGKILL cannot be caught:
those leftovers are reaped by the next start (see :func:`owner_alive`) or ``clover-agent sandbox
prune``.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

_cleanups: dict[int, Callable[[], None]] = {}
_lock = threading.Lock()
_ids = itertools.count(1)
_previous: dict[int, object] = {}
_atexit_installed = False

#: Identifies this machine in leftover labels, so a shared Docker host never reaps another
#: machine's live sandboxes.
HOST_ID = socket.gethostname()


def owner_alive(pid: int, host: str | None) -> bool:
    """Whether the process that made a sandbox may still be running (True when unsure)."""
    if host is not None and host != HOST_ID:
        return True  # another machine's process: we cannot tell, so leave it
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register(cleanup: Callable[[], None]) -> int:
    """Run ``cleanup`` on SIGINT, SIGTERM or interpreter exit until :func:`unregister` is called."""
    with _lock:
        token = next(_ids)
        _cleanups[token] = cleanup
    _install()
    return token


def unregister(token: int) -> None:
    with _lock:
        _cleanups.pop(token, None)


def run_all() -> None:
    """Run and forget every registered cleanup (errors are logged, never raised)."""
    with _lock:
        pending = list(_cleanups.values())
        _cleanups.clear()
    for cleanup in pending:
        try:
            cleanup()
        except Exception as exc:
            log.warning("sandbox cleanup failed: %s", exc)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Close every sandbox, then do what the signal did before we took it over."""
    try:
        run_all()
    finally:
        previous = _previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL (ignored and unknown dispositions are never taken over, see _install)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def _install() -> None:
    global _atexit_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(run_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; a later start may do it
    for signum in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(signum)
        # An ignored signal (a background job of a non-interactive shell, nohup) must stay
        # ignored: closing the sandboxes of a process that carries on would leave it with dead
        # ones. None is a handler set outside Python that we could not hand the signal back to.
        if current is _on_signal or current is None or current == signal.SIG_IGN:
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)
