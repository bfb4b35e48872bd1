"""The sandboxes' own errors. The CLI maps these types to exit codes in one table
(:data:`clover_agent.errors.EXIT_CODES`); each carries one readable ``message``."""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every sandbox error; raised itself when the sandbox broke while in use (its runner or
    container died, e.g. killed out of memory).

    File operations raise the usual ``OSError`` subclasses (``FileNotFoundError``, ...) with the
    sandbox path instead.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class SandboxUnavailable(SandboxError):
    """No sandbox can be started here: Docker is missing or not running, or the image is missing."""


class SandboxConfigError(SandboxError):
    """What the caller asked for is wrong: an unknown sandbox kind, a repository folder that does
    not exist, a spec that is not complete."""


class SandboxArgumentError(ValueError):
    """An argument cannot go into the sandbox (a NUL byte, a lone surrogate, an ``=`` in an
    environment variable's name): refused before anything ran; the sandbox stays usable and the
    message says what to change."""


class SandboxSetupError(SandboxError):
    """The project's environment could not be set up (a dependency that cannot be installed, a
    set-up command that failed, dependency files that cannot be read): the message names the
    cause, shows the failing command's output and says how to change the set-up. ``native_build``:
    it failed building an extension without a compiler (the compiler variant may help); ``log``:
    the failing step's whole output (the message holds its decisive lines and tail), which ``fix``
    keeps in the run folder."""

    def __init__(self, message: str, *, native_build: bool = False, log: str = "") -> None:
        super().__init__(message)
        self.native_build = native_build
        self.log = log


class WorkspaceDiffError(SandboxError):
    """The sandbox works, but git could not diff its workspace (a file too large for git under
    the memory limit, a full disk, a repository the agent broke): only the trajectory's record of
    the workspace is missing (``fix`` makes its patch on the host)."""
