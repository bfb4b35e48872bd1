"""``clover-agent serve`` under N concurrent agent-like sessions (not a test; numbers go to
bench/RESULTS.md).

Each session is a conversation over HTTP with the official ``openai`` client, streamed: a shared
agent-style system prompt with tools, the session's own task, then turns. After each answer the
session appends a tool call and its result (scripted, tool-call shaped, a few hundred tokens), so
the prompt grows as an agent's does and earlier turns can come from the prefix cache. The answers
are the model's. Per N: aggregate output tokens/s (all sessions' tokens over the wall time),
per-session tokens/s (median), time to the first block (first streamed text), p50/p99 latency of
a turn, and the server's forwards per step and tokens per forward over the run (from /metrics).

    .venv/bin/python bench/serve_bench.py [--base-url URL] [--model DIR] [--sessions 1,2,4,8,16]
                                          [--turns 3] [--max-tokens 32] [--out bench/RESULTS.md]

Without --base-url a server is started in this process on --model, or on a tiny random checkpoint
(``write_tiny_checkpoint``, ``--vocab real`` or ``small``) when no --model is given.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import openai
from decode_bench import write_section

SECTION_START = "<!-- serve-bench:start -->"
SECTION_END = "<!-- serve-bench:end -->"

SYSTEM = (
    "You are a coding agent working in a repository at /workspace. Use the tools to inspect files, run "
    "commands and tests, and edit code. Think briefly, then call one tool per turn. "
) * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, description, arg in (
        ("shell", "Run a shell command in /workspace", "command"),
        ("editor", "View or edit a file", "path"),
        ("run_tests", "Run the tests", "target"),
        ("finish", "Finish with a summary", "summary"),
    )
]
TOOL_OUTPUT = "\n".join(
    f"src/module_{i}.py: def function_{i}(x): return x * {i}  # line {i}" for i in range(12)
)


@dataclass
class Turn:
    seconds: float
    first_block: float | None
    tokens: int


@dataclass
class Session:
    number: int
    turns: list[Turn] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.turns)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.turns)


def _turn(client: openai.OpenAI, messages: list[dict], max_tokens: int, seed: int) -> tuple[Turn, str]:
    started = time.perf_counter()
    first: float | None = None
    text, tokens = [], 0
    stream = client.chat.completions.create(
        model="clover", messages=messages, tools=TOOLS, max_tokens=max_tokens, seed=seed, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        piece = (delta.content or "") + (getattr(delta, "reasoning_content", None) or "")
        if (piece or delta.tool_calls) and first is None:
            first = time.perf_counter() - started
        text.append(delta.content or "")
    return Turn(time.perf_counter() - started, first, tokens), "".join(text)


def run_session(base_url: str, api_key: str, number: int, turns: int, max_tokens: int) -> Session:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=5)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {number}: the test tests/test_module_{number}.py fails; fix it."},
    ]
    session = Session(number)
    for step in range(turns):
        turn, text = _turn(client, messages, max_tokens, seed=number * 100 + step)
        session.turns.append(turn)
        call_id = f"call_{number}_{step}"
        messages.append({"role": "assistant", "content": text, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": '{"command": "grep -rn def src"}'}}]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": call_id, "content": TOOL_OUTPUT})
    return session


def _metrics(base_url: str, api_key: str) -> dict[str, float]:
    request = urllib.request.Request(base_url.removesuffix("/v1") + "/metrics")
    request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        lines = response.read().decode().splitlines()
    return {line.split()[0]: float(line.split()[1]) for line in lines if line and not line.startswith("#")}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(base_url: str, api_key: str, n: int, turns: int, max_tokens: int) -> dict[str, float]:
    before = _metrics(base_url, api_key)
    sessions: list[Session] = []
    lock = threading.Lock()

    def one(number: int) -> None:
        session = run_session(base_url, api_key, number, turns, max_tokens)
        with lock:
            sessions.append(session)

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(n * 1000 + i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    after = _metrics(base_url, api_key)
    all_turns = [t for s in sessions for t in s.turns]
    steps = after["clover_steps_total"] - before["clover_steps_total"]
    forwards = after["clover_forwards_total"] - before["clover_forwards_total"]
    generated = after["clover_generated_tokens_total"] - before["clover_generated_tokens_total"]
    return {
        "sessions": n,
        "tokens": sum(s.tokens for s in sessions),
        "wall_s": wall,
        "aggregate_tps": sum(s.tokens for s in sessions) / wall,
        "session_tps": statistics.median(s.tokens / s.seconds for s in sessions),
        "first_block_p50": statistics.median(t.first_block for t in all_turns if t.first_block is not None),
        "latency_p50": _percentile([t.seconds for t in all_turns], 0.5),
        "latency_p99": _percentile([t.seconds for t in all_turns], 0.99),
        "forwards_per_step": forwards / steps if steps else 0.0,
        "tokens_per_forward": generated / forwards if forwards else 0.0,
    }


@contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    """(API root, key, what is served): the given server, or one started here."""
    if args.base_url:
        yield args.base_url, args.api_key or os.environ.get("CLOVER_API_KEY", "none"), args.base_url
        return
    from clover_agent.backends.engine import EngineBackend
    from clover_agent.engine.batching import BatchEngine
    from clover_agent.engine.loading.tiny import write_tiny_checkpoint
    from clover_agent.serve.app import Served
    from clover_agent.serve.server import serving_in_thread
    from clover_agent.settings import Settings

    with tempfile.TemporaryDirectory() as folder:
        model = args.model or write_tiny_checkpoint(
            Path(folder) / "tiny", vocab=args.vocab, vocab_cache=Settings.load().vocab_cache
        )
        backend = EngineBackend(model, device=args.device, progress=None)
        batch = BatchEngine(backend.load_now(), max_running=max(args.sessions), max_queued=64)
        what = f"{model if args.model else f'tiny random checkpoint, {args.vocab} vocabulary'} on {backend.device}"
        with serving_in_thread(Served(backend, batch, max_new_tokens=args.max_tokens)) as base_url:
            yield base_url, "none", what


def _table(rows: list[dict[str, float]]) -> str:
    one = rows[0]["aggregate_tps"] if rows and rows[0]["sessions"] == 1 else None
    lines = [
        "| sessions | tokens | wall s | aggregate tok/s | vs 1 | per-session tok/s (median) | first block p50 s "
        "| latency p50 s | latency p99 s | forwards/step | tokens/forward |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = f"{r['aggregate_tps'] / one:.2f}x" if one else "-"
        lines.append(
            f"| {r['sessions']:.0f} | {r['tokens']:.0f} | {r['wall_s']:.1f} | {r['aggregate_tps']:.1f} | {ratio} "
            f"| {r['session_tps']:.1f} | {r['first_block_p50']:.2f} | {r['latency_p50']:.2f} | {r['latency_p99']:.2f} "
            f"| {r['forwards_per_step']:.2f} | {r['tokens_per_forward']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running server's API root (default: start one here)")
    parser.add_argument("--api-key", help="its key (default: CLOVER_API_KEY)")
    parser.add_argument("--model", type=Path, help="checkpoint to serve here (default: a tiny random one)")
    parser.add_argument("--device", help="device for a server started here (default: the engine backend's)")
    parser.add_argument(
        "--vocab",
        choices=("real", "small"),
        default="real",
        help="the tiny checkpoint's vocabulary: real (Qwen3.6's 248,320 rows: the output layer dominates a "
        "tiny model's forward) or small (546 tokens)",
    )
    parser.add_argument("--sessions", default="1,2,4,8,16", help="the N values, comma separated")
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--out", type=Path, help="RESULTS.md to update (default: print only)")
    args = parser.parse_args()
    args.sessions = [int(n) for n in args.sessions.split(",")]
    with _server(args) as (base_url, key, what):
        measure(base_url, key, 1, 1, args.max_tokens)  # warm-up: first-call costs out of the rows
        rows = [measure(base_url, key, n, args.turns, args.max_tokens) for n in args.sessions]
    commit = os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or "?"
    section = "\n".join([
        SECTION_START,
        "## Serving: concurrent agent-like sessions over HTTP",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; commit {commit}",
        f"- nproc: {os.cpu_count()}; {platform.processor() or platform.machine()}; served: {what}",
        f"- `bench/serve_bench.py --sessions {','.join(map(str, args.sessions))} --turns {args.turns} "
        f"--max-tokens {args.max_tokens}`: each session streams {args.turns} turns of up to {args.max_tokens} "
        "tokens; its prompt grows by a scripted tool call and result after each",
        "",
        _table(rows),
        "",
        "Aggregate: every session's output tokens over the run's wall time. The first block is the first "
        "streamed text of a turn (prefill and one block). forwards/step: request forwards batched per "
        "model step (from /metrics).",
        SECTION_END,
        "",
    ])  # fmt: skip
    print(section)
    if args.out:
        write_section(args.out, section, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
