"""Docker Engine API calls with a deadline suited to each, retried where that is safe, and
failures in words (exit 4), never a ``requests`` traceback.

docker-py gives every request of a client the same timeout. :class:`EngineCalls` wraps one client
and gives each call its own: :data:`QUICK` (ping, inspect, list) or :data:`SLOW` (create, start,
remove, copy, commit: a loaded engine can take long, and a client that gives up early leaves a
container behind), both scaled by ``CLOVER_DOCKER_TIMEOUT`` in the spec's environment (default
:data:`DEFAULT_SLOW_S`). A call that may be repeated without changing the outcome is tried up to
:data:`ATTEMPTS` times; any other fails at once as :class:`SandboxUnavailable`
(sandboxes/README.md, "Docker API deadlines").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from clover_agent.sandboxes.errors import SandboxConfigError, SandboxUnavailable

if TYPE_CHECKING:
    import docker

T = TypeVar("T")

DEFAULT_SLOW_S = 120.0
QUICK, SLOW = "quick", "slow"
ATTEMPTS = 3
TIMEOUT_VARIABLE = "CLOVER_DOCKER_TIMEOUT"


def slow_timeout(environment: Mapping[str, str]) -> float:
    """Seconds a slow Engine API call may take (``CLOVER_DOCKER_TIMEOUT``, default 120)."""
    text = environment.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SLOW_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise SandboxConfigError(
            f"{TIMEOUT_VARIABLE}={text!r}: give the seconds a Docker API call may take, above 0"
        )
    return value


def _unanswered() -> tuple[type[BaseException], ...]:
    """The errors that mean the engine did not answer (not an answer saying no)."""
    import requests

    return (requests.exceptions.Timeout, requests.exceptions.ConnectionError, TimeoutError, ConnectionError)


class EngineCalls:
    """Engine API calls on ``client`` (see the module docstring). Thread-safe: a call holds the
    client while it sets its deadline and runs."""

    def __init__(self, client: docker.DockerClient, environment: Mapping[str, str]) -> None:
        self.client = client
        self.slow_s = slow_timeout(environment)
        self.quick_s = self.slow_s / 4
        self._lock = threading.Lock()

    def __call__(
        self, what: str, speed: str, call: Callable[..., T], *args: Any, retry: bool = False, **kwargs: Any
    ) -> T:
        """``call(*args, **kwargs)`` (a method of ``client.api``) under the deadline of ``speed``;
        ``what`` says what it does, for the message ("creating the sandbox container")."""
        timeout = self.quick_s if speed == QUICK else self.slow_s
        unanswered = _unanswered()
        attempts = ATTEMPTS if retry else 1
        attempt = 1
        while True:
            with self._lock:
                api = self.client.api
                # a float timeout works (requests takes one); docker's stubs say int
                previous, api.timeout = api.timeout, timeout  # type: ignore[assignment]
                try:
                    return call(*args, **kwargs)
                except unanswered as exc:
                    if attempt == attempts:
                        tries = f", {attempts} tries" if attempts > 1 else ""
                        raise SandboxUnavailable(
                            f"the Docker engine did not answer while {what} ({_why(exc, timeout)}{tries}); "
                            "it may be overloaded or stuck: check `docker info`, or allow more time with "
                            f"{TIMEOUT_VARIABLE}=SECONDS (now {self.slow_s:g})"
                        ) from None
                finally:
                    api.timeout = previous
            attempt += 1


def _why(exc: BaseException, timeout: float) -> str:
    import requests

    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
        return f"no answer within {timeout:g} s"
    return "the connection to it was lost"
