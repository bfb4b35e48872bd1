"""Fixtures shared by the engine tests.

The tiny models here run one intra-op thread: their tensors are too small to split, and on a
loaded machine a thread pool waiting for busy cores makes each operator ~20x slower. Child
processes (the CLI tests) inherit ``OMP_NUM_THREADS``.

Without a GPU the ``kernels="triton"`` tests run the kernels in the interpreter
(``TRITON_INTERPRET=1``, set by the root ``tests/conftest.py`` before anything imports triton).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from clover_agent.engine.loading.tiny import write_tiny_checkpoint

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with tokenizer files and confident outputs (several tokens commit per pass)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", peaked=True, seed=3)


@pytest.fixture(scope="module")
def two_layer_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two layers (GDN with the bidirectional tensors, then attention): every kind of layer and
    operator, in as few operations as that takes (traced steps, interpreted kernels)."""
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("two-layer") / "tiny",
        peaked=True,
        seed=3,
        bidirectional=True,
        tokenizer=False,
        overrides={"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    )
