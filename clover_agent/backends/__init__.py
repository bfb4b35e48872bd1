"""Model backends: where assistant turns come from (``engine``, ``openai``, ``replay``)."""

from clover_agent.backends.base import (
    BackendEvent,
    BackendUnavailable,
    EventCallback,
    ModelBackend,
    ModelTurn,
    ReplayExhausted,
)

__all__ = [
    "BackendEvent",
    "BackendUnavailable",
    "EventCallback",
    "ModelBackend",
    "ModelTurn",
    "ReplayExhausted",
]
