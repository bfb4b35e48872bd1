"""``/metrics`` text follows Prometheus' exposition format (HELP and TYPE before each family, one
sample a line, labels quoted) and carries the engine's numbers; the token rate is measured over
its window."""

from __future__ import annotations

import re

from clover_agent.engine.batching import BatchStats
from clover_agent.serve.metrics import ServeMetrics, TokenRate

SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(\{[a-z_]+="[a-z_]+"(,[a-z_]+="[a-z_]+")*\})? (-?[0-9.e+-]+)$')


def _stats(**changes: int) -> BatchStats:
    values = dict(
        queued=2, running=3, finished=10, cancelled=1, failed=0, steps=50, forwards=120, tokens_forwarded=4000,
        generated_tokens=600, running_cache_bytes=1 << 20, prefix_cache_bytes=2048, prefix_cache_entries=4,
        max_running=8, max_queued=64, held_for_share=5,
    )  # fmt: skip
    values.update(changes)
    return BatchStats(**values)


def test_the_text_is_prometheus_exposition_format() -> None:
    metrics = ServeMetrics()
    metrics.count("completed", prompt=100, completion=20, cached=64, first_block_s=0.5, request_s=2.0)
    metrics.count("completed", prompt=10, completion=2, first_block_s=0.25, request_s=1.0)
    metrics.count("overloaded")
    text = metrics.render(_stats(), draining=True)
    declared: dict[str, str] = {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "summary") and name not in declared
            declared[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, line
        family = re.sub(r"_(sum|count)$", "", match.group(1))
        assert match.group(1) in declared or declared.get(family) == "summary"  # declared before its samples
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(4))
    assert samples['clover_requests_total{outcome="completed"}'] == 2
    assert (
        samples["clover_first_block_seconds_sum"] == 0.75 and samples["clover_first_block_seconds_count"] == 2
    )
    assert samples["clover_request_seconds_sum"] == 3.0 and samples["clover_request_seconds_count"] == 2
    assert samples['clover_requests_total{outcome="overloaded"}'] == 1
    assert samples['clover_tokens_total{kind="cached"}'] == 64
    assert samples["clover_queued_requests"] == 2 and samples["clover_running_requests"] == 3
    assert samples["clover_draining"] == 1
    assert samples["clover_forwards_per_step"] == 120 / 50
    assert samples["clover_tokens_per_forward"] == 600 / 120
    assert samples["clover_running_cache_bytes"] == 1 << 20
    assert samples["clover_held_for_shared_prefix_total"] == 5
    assert text.endswith("\n")


def test_the_token_rate_is_over_its_window() -> None:
    rate = TokenRate(window=10.0)
    assert rate.sample(0, now=100.0) == 0.0
    assert rate.sample(50, now=105.0) == 10.0
    assert rate.sample(150, now=110.0) == 15.0
    # past the window the oldest sample is dropped: 150 -> 250 over the last 10 s
    assert rate.sample(250, now=120.0) == 10.0
