"""Exit codes, the runtime's own error type, and the one table from every layer's errors to codes.

Every failure a user can cause or fix (missing GPU, missing weights, Docker down, bad arguments)
ends as one clear message and a documented exit code, never a traceback. The runtime's own errors
are :class:`CloverError` subclasses, each carrying its exit code. The layers below own their errors
and know nothing of exit codes: the engine raises :class:`~clover_agent.engine.errors.EngineError`,
the sandboxes :class:`~clover_agent.sandboxes.errors.SandboxError`. :data:`EXIT_CODES` maps those
types to codes; :func:`exit_code_for` and :func:`message_of` are what the CLI, the agent loop and
the ``fix`` workflow use to turn any of them (:data:`RUN_ERRORS`) into an outcome.
"""

from __future__ import annotations

from enum import IntEnum

from clover_agent.engine.errors import CheckpointError, EngineArgumentError, EngineError
from clover_agent.sandboxes.errors import SandboxConfigError, SandboxError, SandboxUnavailable


class ExitCode(IntEnum):
    """Process exit codes, documented in the README."""

    OK = 0
    FAILURE = 1  # the job ran and did not succeed (tests still failing, tool error, doctor not ready or its plan not fitting)
    USAGE = 2  # bad command line or arguments
    MODEL_UNAVAILABLE = 3  # the model backend cannot serve: no GPU, no weights, server unreachable
    SANDBOX_UNAVAILABLE = 4  # Docker missing or not running, or the sandbox image missing
    NOTHING_TO_FIX = 5  # the target tests already pass
    BUDGET_EXHAUSTED = 6  # step, time or token budget spent before the task was finished
    AGENT_ERROR = 7  # the agent stopped: stuck, replay exhausted, repeated format errors
    SUITE_UNVERIFIED = 8  # fix: the target passes, but the rest of the suite could not be checked
    NEEDS_REVIEW = 9  # fix: the target passes, but a check of how it passes found something to look at
    BLOCKED = 10  # ci: a UserPromptSubmit hook kept the task from the model (fix: 1)
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


#: The lower layers' error types and their exit codes; the first entry the error is an instance of
#: wins, so subclasses come before their bases.
EXIT_CODES: tuple[tuple[type[Exception], ExitCode], ...] = (
    (CheckpointError, ExitCode.MODEL_UNAVAILABLE),
    (EngineArgumentError, ExitCode.USAGE),
    (EngineError, ExitCode.MODEL_UNAVAILABLE),
    (SandboxUnavailable, ExitCode.SANDBOX_UNAVAILABLE),
    (SandboxConfigError, ExitCode.USAGE),
    (SandboxError, ExitCode.SANDBOX_UNAVAILABLE),
)

#: Every error a layer raises on purpose: what a run or a command turns into an outcome. (Not
#: annotated ``tuple[type[Exception], ...]``: mypy rejects that type starred in an ``except``.)
RUN_ERRORS = (CloverError, EngineError, SandboxError)


def exit_code_for(error: BaseException) -> ExitCode:
    """The exit code ``error`` ends a command with: its own for a :class:`CloverError`, else the
    first matching entry of :data:`EXIT_CODES`, else :attr:`ExitCode.FAILURE`."""
    if isinstance(error, CloverError):
        return error.exit_code
    for kind, code in EXIT_CODES:
        if isinstance(error, kind):
            return code
    return ExitCode.FAILURE


def message_of(error: BaseException) -> str:
    """The one-line (or few-line) message of any of :data:`RUN_ERRORS`."""
    message = getattr(error, "message", None)
    return message if isinstance(message, str) else str(error)
