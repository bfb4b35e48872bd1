"""Model backends: where assistant turns come from (``engine``, ``openai``, ``replay``)."""

from typing import Any

from clover_agent.backends.base import (
    BackendEvent,
    BackendUnavailable,
    EventCallback,
    ModelBackend,
    ModelTurn,
    ReplayExhausted,
)
from clover_agent.errors import UsageError

__all__ = [
    "BACKEND_KINDS",
    "BackendEvent",
    "BackendUnavailable",
    "EventCallback",
    "ModelBackend",
    "ModelTurn",
    "ReplayExhausted",
    "create_backend",
]

BACKEND_KINDS = ("engine", "openai", "replay")


def create_backend(kind: str, **options: Any) -> ModelBackend:
    """The backend ``kind`` built with ``options`` (the keyword arguments of its class:
    :class:`~clover_agent.backends.replay.ReplayBackend` takes ``path``,
    :class:`~clover_agent.backends.openai.OpenAIBackend` ``base_url`` and friends,
    :class:`~clover_agent.backends.engine.EngineBackend` ``model_dir`` and friends). Modules load
    on demand, so choosing ``openai`` or ``replay`` never imports torch."""
    if kind == "replay":
        from clover_agent.backends.replay import ReplayBackend

        return ReplayBackend(**options)
    if kind == "openai":
        from clover_agent.backends.openai import OpenAIBackend

        return OpenAIBackend(**options)
    if kind == "engine":
        from clover_agent.backends.engine import EngineBackend

        return EngineBackend(**options)
    raise UsageError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKEND_KINDS)}")
