"""A real ``serve`` server for tests: a tiny checkpoint with the real Qwen3.6 vocabulary, the batch
engine on it (served in a thread by ``clover_agent.serve.server.serving_in_thread``), and plain HTTP."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_agent.backends.engine import EngineBackend
from clover_agent.engine.batching import BatchEngine, BatchStats
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.serve.app import Served

#: Generous bound for anything a test waits for (a poll, never a timing assertion).
DEADLINE_S = 120.0


def tiny_real_checkpoint(folder: Path) -> Path:
    """A tiny checkpoint with the real vocabulary (its conversion cached between processes)."""
    from clover_agent.settings import Settings

    return write_tiny_checkpoint(folder, vocab="real", vocab_cache=Settings.load().vocab_cache)


def served_model(model_dir: Path, *, max_running: int = 8, max_queued: int = 64, **options: Any) -> Served:
    """The checkpoint loaded on the CPU and served; ``options``: :class:`Served`'s (api_key, max_new_tokens)."""
    backend = EngineBackend(model_dir, device="cpu", progress=None)
    batch = BatchEngine(backend.load_now(), max_running=max_running, max_queued=max_queued)
    return Served(backend, batch, **options)


def wait_for(condition: Callable[[], object], what: str, deadline: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"waited {deadline:.0f} s for {what}")
        time.sleep(0.05)


def wait_for_stats(served: Served, condition: Callable[[BatchStats], bool], what: str) -> BatchStats:
    wait_for(lambda: condition(served.batch.stats()), what)
    return served.batch.stats()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def http(method: str, url: str, body: bytes | None = None, key: str | None = None) -> Reply:
    """One plain HTTP request (for what the openai client does not send: raw bodies, /health, /metrics)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            return Reply(response.status, dict(response.headers), response.read().decode())
    except urllib.error.HTTPError as error:
        return Reply(error.code, dict(error.headers), error.read().decode())


def root(base_url: str) -> str:
    return base_url.removesuffix("/v1")
