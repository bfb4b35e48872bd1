"""Concurrent agent-like sessions against an OpenAI-compatible server (`clover-agent serve`).

Not a test; numbers go to bench/RESULTS.md. Each session is a small agent conversation: a system
prompt and the tools an agent offers, then several turns, each sending the whole conversation so far
plus a tool-result-shaped message (the prompt grows every turn, as an agent's does), streamed. The
sessions of a level share their system prompt and tools, as one product's agents do, and differ from
their first user message on (``--distinct-system``: each its own). For N sessions at once (N = 1, 2,
4, 8, 16 by default) it measures:

- aggregate generated tokens/s (all sessions' completion tokens over the wall time of the level),
  and its ratio to N = 1 measured in the same run (every level runs ``--repeats`` times,
  interleaved; the run of median aggregate tokens/s is reported);
- per-session tokens/s (median over sessions);
- time to first block: the server's own mean (``clover_first_block_seconds`` of ``/metrics``, arrival
  to the first committed block) and, as the client sees it, the first streamed text, p50 (a random
  tiny model writes byte tokens that are not whole UTF-8 characters, held back until completed, so
  there the first text comes late);
- turn latency, p50 and p99;
- what the server ran for it: prompt tokens prefilled per output token (each prompt less the prefix
  the server reused, from ``usage``), and request forwards per batched step (``/metrics``). Prefill
  is arithmetic on every new prompt token, which batching cannot share on a CPU: the more of it per
  output token, the less N sessions can gain over one.

    .venv/bin/python bench/serve_bench.py --tiny                    # starts serve on a tiny checkpoint
    .venv/bin/python bench/serve_bench.py --model DIR --device cuda  # starts serve on DIR
    .venv/bin/python bench/serve_bench.py --base-url http://host:8000/v1 --api-key KEY

With ``--tiny`` the checkpoint is the random tiny one the tests use (peaked logits; ``--vocab small``
by default: with the real 248,320-row vocabulary a tiny model's time is its LM head and token
choice, which no batching shares); its answers are noise, so every turn asks for a fixed number of
tokens and the server is told not to stop early (``ignore_eos``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SECTION_START = "<!-- serve-bench:start -->"
SECTION_END = "<!-- serve-bench:end -->"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string"} for key in keys},
                "required": list(keys),
            },
        },
    }
    for name, description, keys in (
        ("read_file", "Read a file of the repository.", ("path",)),
        ("edit_file", "Replace text in a file.", ("path", "old", "new")),
        ("run_tests", "Run the project's tests.", ("selector",)),
        ("shell", "Run a shell command in the sandbox.", ("command",)),
    )
]

TOOL_OUTPUT = """\
============================= test session starts ==============================
collected 12 items

tests/test_calc.py ....F.......                                          [100%]

=================================== FAILURES ===================================
____________________________ test_divide_by_zero _____________________________
    def test_divide_by_zero():
>       assert divide(1, 0) is None
E       ZeroDivisionError: division by zero
calc.py:14: ZeroDivisionError
=========================== short test summary info ============================
FAILED tests/test_calc.py::test_divide_by_zero - ZeroDivisionError
"""


@dataclass
class Turn:
    sent: float
    first: float | None
    done: float
    tokens: int
    prefilled: int = 0  # prompt tokens the server ran (its prompt less the reused prefix)


@dataclass
class Session:
    index: int
    turns: list[Turn] = field(default_factory=list)
    error: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(url: str, body: dict[str, Any] | None, api_key: str | None, timeout: float) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    return urllib.request.urlopen(req, timeout=timeout)


def tools_for(tag: str) -> list[dict[str, Any]]:
    """The tools, the first one's description carrying ``tag``. The chat template lays the tools out
    first, before the system prompt's own text: a tag there keeps one level's prompts (or, with
    ``--distinct-system``, one session's) from starting with state an earlier one left in the
    server's prefix cache."""
    tools = json.loads(json.dumps(TOOLS))
    tools[0]["function"]["description"] += f" (run {tag})"
    return tools


def one_turn(
    args: argparse.Namespace,
    model: str,
    messages: list[dict[str, Any]],
    seed: int,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[Turn, str]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "tools": tools if tools is not None else TOOLS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "seed": seed,
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    sent = time.perf_counter()
    first: float | None = None
    tokens = prefilled = 0
    text: list[str] = []
    with request(f"{args.base_url}/chat/completions", body, args.api_key, args.timeout) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if chunk.get("usage"):
                used = chunk["usage"]
                tokens = int(used.get("completion_tokens") or 0)
                cached = (used.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                prefilled = int(used.get("prompt_tokens") or 0) - int(cached)
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning_content") or ""
                if piece or delta.get("tool_calls"):
                    if first is None:
                        first = time.perf_counter()
                    text.append(piece)
    return Turn(sent, first, time.perf_counter(), tokens, prefilled), "".join(text)


def run_session(args: argparse.Namespace, model: str, session: Session, run_id: str) -> None:
    tools = tools_for(f"{run_id}/{session.index}" if args.distinct_system else run_id)
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a coding agent. Fix the failing test.",
        },
        {"role": "user", "content": f"Task {session.index}: tests/test_calc.py fails; make it pass."},
    ]
    try:
        for turn_index in range(args.turns):
            turn, answer = one_turn(
                args, model, messages, seed=1000 * session.index + turn_index, tools=tools
            )
            session.turns.append(turn)
            messages.append({"role": "assistant", "content": answer[:2000]})
            messages.append({"role": "user", "content": f"Tool result (turn {turn_index}):\n{TOOL_OUTPUT}"})
    except (urllib.error.URLError, OSError, ValueError) as exc:
        session.error = f"{type(exc).__name__}: {exc}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median aggregate tokens/s (its other columns with it), with every run's errors."""
    ordered = sorted(runs, key=lambda r: r["aggregate_tps"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["errors"] = [e for r in runs for e in r["errors"]]
    chosen["runs"] = len(runs)
    return chosen


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: Counters of the server's ``/metrics`` a level reads before and after itself.
COUNTERS = (
    "clover_first_block_seconds_sum",
    "clover_first_block_seconds_count",
    "clover_steps_total",
    "clover_forwards_total",
)


def server_counters(args: argparse.Namespace) -> dict[str, float]:
    """The :data:`COUNTERS` the server reports (none from a server without them)."""
    root = args.base_url.rsplit("/v1", 1)[0]
    try:
        with request(f"{root}/metrics", None, args.api_key, 10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            found[name] = float(value)
    return found


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    return after[name] - before[name] if name in before and name in after else None


def level(args: argparse.Namespace, model: str, sessions: int) -> dict[str, Any]:
    run_id = f"{sessions}-{time.time_ns()}"
    before = server_counters(args)
    states = [Session(i) for i in range(sessions)]
    threads = [threading.Thread(target=run_session, args=(args, model, s, run_id)) for s in states]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    after = server_counters(args)
    first_sum = _delta(before, after, "clover_first_block_seconds_sum")
    first_count = _delta(before, after, "clover_first_block_seconds_count")
    server_first = first_sum / first_count if first_sum is not None and first_count else float("nan")
    steps = _delta(before, after, "clover_steps_total")
    forwards = _delta(before, after, "clover_forwards_total")
    errors = [s.error for s in states if s.error]
    turns = [t for s in states for t in s.turns]
    tokens = sum(t.tokens for t in turns)
    per_session = [
        sum(t.tokens for t in s.turns) / (s.turns[-1].done - s.turns[0].sent) for s in states if s.turns
    ]
    return {
        "sessions": sessions,
        "turns": len(turns),
        "errors": errors,
        "wall_s": wall,
        "tokens": tokens,
        "aggregate_tps": tokens / wall if wall else 0.0,
        "per_session_tps": statistics.median(per_session) if per_session else 0.0,
        "first_block_mean_s": server_first,
        "prefilled_per_token": sum(t.prefilled for t in turns) / tokens if tokens else float("nan"),
        "forwards_per_step": forwards / steps if forwards is not None and steps else float("nan"),
        "first_text_p50_s": percentile([t.first - t.sent for t in turns if t.first is not None], 0.5),
        "latency_p50_s": percentile([t.done - t.sent for t in turns], 0.5),
        "latency_p99_s": percentile([t.done - t.sent for t in turns], 0.99),
    }


def wait_ready(base: str, api_key: str | None, proc: subprocess.Popen[bytes], timeout: float) -> None:
    root = base.rsplit("/v1", 1)[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with code {proc.returncode} before it was ready")
        try:
            with request(f"{root}/health", None, api_key, 5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"serve was not ready within {timeout} s")


def start_server(args: argparse.Namespace, folder: Path) -> subprocess.Popen[bytes]:
    model = args.model
    if args.tiny:
        from clover_agent.engine.loading.tiny import write_tiny_checkpoint

        model = str(write_tiny_checkpoint(folder / "clover-tiny", vocab=args.vocab, peaked=True, seed=3))
    port = free_port()
    args.base_url = f"http://127.0.0.1:{port}/v1"
    command = [
        sys.executable,
        "-m",
        "clover_agent",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--max-running",
        str(max(args.sessions)),
    ]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    log = open(folder / "serve.log", "wb")  # noqa: SIM115 - open for the server's lifetime
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_ready(args.base_url, args.api_key, proc, args.start_timeout)
    return proc


def markdown(results: list[dict[str, Any]], args: argparse.Namespace, server: str) -> str:
    base = results[0]["aggregate_tps"] if results and results[0]["sessions"] == 1 else None
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        SECTION_START,
        f"### serve_bench ({datetime.now(UTC):%Y-%m-%d}, commit {commit or 'unknown'})",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs; server: {server}",
        f"- {args.turns} turns per session, {args.max_tokens} tokens per turn, greedy, streamed, 4 tools offered; "
        + (
            "a system prompt per session"
            if args.distinct_system
            else "one system prompt for a level's sessions"
        )
        + f"; the median of {args.repeats} interleaved runs of each level",
        "",
        "| sessions | aggregate tok/s | × one session | per-session tok/s | first block (server, mean) "
        "| first text p50 | latency p50 | latency p99 | prompt tokens run per output token "
        "| forwards per step |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r['aggregate_tps'] / base:.2f}" if base else "-"
        lines.append(
            f"| {r['sessions']} | {r['aggregate_tps']:.1f} | {ratio} | {r['per_session_tps']:.1f} | "
            f"{r['first_block_mean_s']:.3f} s | {r['first_text_p50_s']:.3f} s | {r['latency_p50_s']:.3f} s | "
            f"{r['latency_p99_s']:.3f} s | {r['prefilled_per_token']:.1f} | {r['forwards_per_step']:.1f} |"
        )
    lines.append(SECTION_END)
    return "\n".join(lines)


def record(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        tail = rest.split(SECTION_END, 1)[1]
        text = head + section + tail
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## Serving: concurrent sessions (bench/serve_bench.py)\n\n"
            + section
            + "\n"
        )
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="an OpenAI-compatible server (…/v1) already running")
    where.add_argument("--model", help="start `clover-agent serve --model DIR` for the run")
    where.add_argument("--tiny", action="store_true", help="start serve on a random tiny checkpoint")
    parser.add_argument("--api-key", default=os.environ.get("CLOVER_API_KEY"))
    parser.add_argument("--vocab", choices=("small", "real"), default="small", help="--tiny's vocabulary")
    parser.add_argument(
        "--threads", type=int, help="the started server's OMP_NUM_THREADS (default: torch's own)"
    )
    parser.add_argument("--model-id", default="clover")
    parser.add_argument("--sessions", default="1,2,4,8,16", help="comma-separated session counts")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--distinct-system",
        action="store_true",
        help="a system prompt of each session's own (by default the sessions of a level share one, "
        "as the agents of one product do, and the server computes it once)",
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of every level, interleaved; the median run is reported"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, help="write the table into this file (bench/RESULTS.md)")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args(argv)
    args.sessions = [int(n) for n in str(args.sessions).split(",") if n.strip()]
    proc: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory() as folder:
        try:
            if args.base_url is None:
                proc = start_server(args, Path(folder))
            server = (
                f"tiny checkpoint ({args.vocab} vocabulary), `clover-agent serve` on the CPU, "
                f"OMP_NUM_THREADS={args.threads or 'unset'}"
                if args.tiny
                else args.base_url
            )
            level(args, args.model_id, 1)  # warm-up: loads, first prefix snapshots, lazy imports
            runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.sessions}
            for _ in range(args.repeats):  # interleaved: every level sees the same machine
                for sessions in args.sessions:
                    result = level(args, args.model_id, sessions)
                    runs[sessions].append(result)
                    print(json.dumps(result), flush=True)
                    if result["errors"]:
                        print(f"errors at {sessions} sessions: {result['errors'][:3]}", file=sys.stderr)
            results = [median_run(runs[n]) for n in args.sessions]
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    table = markdown(results, args, server)
    print(table)
    if args.out:
        record(args.out, table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
