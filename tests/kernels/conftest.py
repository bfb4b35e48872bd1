"""Kernel tests run the Triton kernels in the CPU interpreter when no GPU is present
(``TRITON_INTERPRET=1``, set by the root ``tests/conftest.py`` before anything imports Triton)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

_INT_POISON = -(2**30) + 7


def _poisoned(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype.is_floating_point:
        return tensor.fill_(float("nan"))
    if tensor.dtype == torch.bool:
        return tensor.fill_(True)
    return tensor.fill_(_INT_POISON)


@pytest.fixture
def poisoned_allocations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``torch.empty`` / ``torch.empty_like`` during the test comes back filled with NaN (or a
    large negative integer, or True), so an output element a kernel never writes fails."""
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poisoned(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poisoned(empty_like(*a, **k)))
    yield
