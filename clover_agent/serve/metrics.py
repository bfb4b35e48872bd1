"""``/metrics`` in Prometheus' text exposition format (version 0.0.4): the batch engine's queue,
running requests, steps, tokens per forward, tokens per second and cache bytes, and the server's
requests by outcome and token counts. Written by hand: the format is a few lines per metric."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

from clover_agent.engine.batching import BatchStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Outcomes a chat-completions request ends with (the ``outcome`` label).
OUTCOMES = ("completed", "cancelled", "rejected", "unauthorized", "overloaded", "unavailable", "failed")
#: Seconds over which ``clover_generated_tokens_per_second`` is measured.
RATE_WINDOW_S = 10.0


class TokenRate:
    """Tokens per second over the last :data:`RATE_WINDOW_S` seconds, from samples of a running total."""

    def __init__(self, window: float = RATE_WINDOW_S) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def sample(self, total: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.samples.append((now, total))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        first_time, first_total = self.samples[0]
        return (total - first_total) / (now - first_time) if now > first_time else 0.0


class ServeMetrics:
    """The server's own counters (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()  # prompt, completion, cached
        self.seconds: dict[str, list[float]] = {"first_block": [0.0, 0], "request": [0.0, 0]}  # sum, count
        self.rate = TokenRate()

    def count(
        self,
        outcome: str,
        *,
        prompt: int = 0,
        completion: int = 0,
        cached: int = 0,
        first_block_s: float | None = None,
        request_s: float | None = None,
    ) -> None:
        """One request ended with ``outcome``; a completed one brings its tokens and times (from
        its arrival to its first committed block, and to its end)."""
        with self._lock:
            self.outcomes[outcome] += 1
            self.tokens.update(prompt=prompt, completion=completion, cached=cached)
            for name, value in (("first_block", first_block_s), ("request", request_s)):
                if value is not None:
                    self.seconds[name][0] += value
                    self.seconds[name][1] += 1

    def render(self, stats: BatchStats, *, draining: bool) -> str:
        with self._lock:
            outcomes = dict(self.outcomes)
            tokens = dict(self.tokens)
            seconds = {name: tuple(pair) for name, pair in self.seconds.items()}
            rate = self.rate.sample(stats.generated_tokens)
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, values: list[tuple[str, Any]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            # a summary's samples are its name with _sum and _count; the others' a label set
            lines.extend(f"{name}{labels} {_number(value)}" for labels, value in values)

        def one(name: str, kind: str, help_text: str, value: Any) -> None:
            metric(name, kind, help_text, [("", value)])

        metric(
            "clover_requests_total",
            "counter",
            "Chat-completion requests by how they ended.",
            [(f'{{outcome="{o}"}}', outcomes.get(o, 0)) for o in OUTCOMES],
        )
        metric(
            "clover_tokens_total",
            "counter",
            "Tokens of answered requests: prompt, completion, and prompt tokens reused from the cache.",
            [(f'{{kind="{k}"}}', tokens.get(k, 0)) for k in ("prompt", "completion", "cached")],
        )
        for name, help_text in (
            ("first_block", "Seconds from a completed request's arrival to its first committed block."),
            ("request", "Seconds from a completed request's arrival to its end."),
        ):
            total, count = seconds[name]
            metric(f"clover_{name}_seconds", "summary", help_text, [("_sum", total), ("_count", int(count))])
        one("clover_queued_requests", "gauge", "Requests waiting for a running slot.", stats.queued)
        one("clover_running_requests", "gauge", "Requests being decoded.", stats.running)
        one("clover_max_running_requests", "gauge", "Requests decoded together at most.", stats.max_running)
        one("clover_max_queued_requests", "gauge", "Requests that may wait at most.", stats.max_queued)
        one("clover_draining", "gauge", "1 while the server drains (takes no new requests).", int(draining))
        metric(
            "clover_engine_requests_total",
            "counter",
            "Engine requests by how they ended.",
            [('{state="finished"}', stats.finished), ('{state="cancelled"}', stats.cancelled),
             ('{state="failed"}', stats.failed)],
        )  # fmt: skip
        one("clover_steps_total", "counter", "Batched forward steps run.", stats.steps)
        one("clover_forwards_total", "counter", "Request forwards run inside the steps.", stats.forwards)
        one("clover_forwarded_tokens_total", "counter", "Tokens through the model.", stats.tokens_forwarded)
        one("clover_generated_tokens_total", "counter", "Tokens committed as output.", stats.generated_tokens)
        one(
            "clover_forwards_per_step", "gauge", "Request forwards per batched step.", stats.forwards_per_step
        )
        tokens_per_forward = stats.generated_tokens / stats.forwards if stats.forwards else 0.0
        one("clover_tokens_per_forward", "gauge", "Output tokens per request forward.", tokens_per_forward)
        one(
            "clover_generated_tokens_per_second",
            "gauge",
            f"Output tokens per second over the last {RATE_WINDOW_S:g} s (between scrapes).",
            rate,
        )
        one(
            "clover_running_cache_bytes",
            "gauge",
            "Cache bytes of the running requests.",
            stats.running_cache_bytes,
        )
        one("clover_prefix_cache_bytes", "gauge", "Bytes of the prefix cache.", stats.prefix_cache_bytes)
        one(
            "clover_held_for_shared_prefix_total",
            "counter",
            "Requests that waited while another computed the first message they share, then reused it.",
            stats.held_for_share,
        )
        one(
            "clover_prefix_cache_entries", "gauge", "Entries of the prefix cache.", stats.prefix_cache_entries
        )
        return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
