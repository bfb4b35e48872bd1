"""What every kernel folder shares: whether Triton can run here, and the dot precision to ask for.

Triton decides at decoration time whether a ``@triton.jit`` function is compiled for a GPU or run by
its CPU interpreter (``TRITON_INTERPRET=1``), so :func:`triton_problem` looks at how this package's
kernels were actually decorated, not only at the environment now.
"""

from __future__ import annotations

import torch

try:
    import triton
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    triton = None


def _probe() -> None:
    pass


#: Decorated at import, like the kernels (each kernel module imports this one first): whether they
#: became interpreted functions.
_INTERPRETED = triton is not None and type(triton.jit(_probe)).__name__ == "InterpretedFunction"


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return _INTERPRETED


def triton_problem() -> str | None:
    """None when the Triton kernels can run here, else the reason in words."""
    if triton is None:
        return "triton is not installed"
    if interpreting() or torch.cuda.is_available():
        return None
    return "no CUDA device and TRITON_INTERPRET=1 was not set before triton was imported"


def available() -> bool:
    """Triton importable and a CUDA device or the interpreter."""
    return triton_problem() is None


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision for operands of ``dtype``: exact float32 (no TF32) for float32
    inputs, so a float32 run checks the same arithmetic as the reference; native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
