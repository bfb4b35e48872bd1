"""Exit codes and the one exception type the CLI turns into a clear message.

Every failure a user can cause or fix (missing GPU, missing weights, Docker down, bad arguments)
is raised as a :class:`CloverError` subclass carrying its exit code and a message that names what
is missing and the ways forward. The CLI prints the message, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes, documented in the README."""

    OK = 0
    FAILURE = 1  # the job ran and did not succeed (tests still failing, tool error, doctor not ready)
    USAGE = 2  # bad command line or arguments
    MODEL_UNAVAILABLE = 3  # the model backend cannot serve: no GPU, no weights, server unreachable
    SANDBOX_UNAVAILABLE = 4  # Docker missing or not running, or the sandbox image missing
    NOTHING_TO_FIX = 5  # the target tests already pass
    BUDGET_EXHAUSTED = 6  # step, time or token budget spent before the task was finished
    AGENT_ERROR = 7  # the agent stopped: stuck, replay exhausted, repeated format errors
    INTERRUPTED = 130  # Ctrl-C


class CloverError(Exception):
    """An error with a user-facing message and an exit code."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(CloverError):
    exit_code = ExitCode.USAGE


class ModelUnavailable(CloverError):
    """The chosen model backend cannot serve (no GPU, no weights, server unreachable)."""

    exit_code = ExitCode.MODEL_UNAVAILABLE


class SandboxUnavailable(CloverError):
    """Docker is missing, not running, or the sandbox image is missing."""

    exit_code = ExitCode.SANDBOX_UNAVAILABLE
