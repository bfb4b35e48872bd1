"""The error a broken checkpoint folder raises (bad config, missing file, tensor mismatch)."""

from __future__ import annotations

from clover_agent.errors import ModelUnavailable


class CheckpointError(ModelUnavailable):
    """The checkpoint cannot be used as it is; the message names the file or tensor at fault."""
