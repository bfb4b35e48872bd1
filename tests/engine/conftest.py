"""Fixtures shared by the engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.engine.tiny import write_tiny_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with tokenizer files and confident outputs (several tokens commit per pass)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", peaked=True, seed=3)
