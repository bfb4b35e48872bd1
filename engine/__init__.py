"""In-process block-diffusion engine for Clover-35B-A3B (imports as ``clover_agent.engine``).

``Engine``, ``SamplingParams`` and ``GenerationResult`` are importable from here; each is loaded
on first access (module ``__getattr__``), so importing the package, or ``clover_agent``, does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clover_agent.engine.decoding.sampling import GenerationResult, SamplingParams
    from clover_agent.engine.engine import Engine

#: Public name -> the module that defines it.
_EXPORTS = {
    "Engine": "clover_agent.engine.engine",
    "SamplingParams": "clover_agent.engine.decoding.sampling",
    "GenerationResult": "clover_agent.engine.decoding.sampling",
}
__all__ = ["Engine", "GenerationResult", "SamplingParams"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
