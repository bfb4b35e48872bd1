"""Host numbers to the device without waiting for it.

``torch.tensor(values, device="cuda")`` copies from pageable memory and then synchronises the
stream: the host waits for every kernel already queued, so it can no longer run ahead of the GPU.
:func:`upload` copies through pinned memory instead, asynchronously (the pinned buffer is kept by
PyTorch's host allocator until the copy has run). Inside a decoding step nothing else may move
host data to the device (tests/engine/test_host_syncs.py counts both directions).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def upload(
    values: Sequence[int] | Sequence[float],
    device: torch.device,
    dtype: torch.dtype = torch.long,
    *,
    into: torch.Tensor | None = None,
) -> torch.Tensor:
    """``values`` as a 1-D ``dtype`` tensor on ``device``, queued behind the device's work; with
    ``into``, copied into that tensor instead (its device, dtype and shape; a CUDA graph's static
    input keeps its address), which is returned."""
    host = torch.tensor(values, dtype=dtype if into is None else into.dtype)
    if into is not None:
        host = host.reshape(into.shape)
        return into.copy_(host.pin_memory() if into.device.type == "cuda" else host, non_blocking=True)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
