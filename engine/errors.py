"""The engine's own errors: a broken checkpoint folder, a bad argument to the engine.

The engine knows nothing of the command line: the CLI maps these types to exit codes in one table
(:data:`clover_agent.errors.EXIT_CODES`). Each carries one readable ``message`` (no repr, no
traceback needed).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class CheckpointError(EngineError):
    """The checkpoint cannot be used as it is; the message names the file or tensor at fault."""


class EngineArgumentError(EngineError):
    """A caller passed the engine something it does not take (e.g. an unknown ``kernels`` choice)."""
