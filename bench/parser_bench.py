"""Tool-call parser benchmark: time and memory of ``parse_assistant`` against the reply's size, for
the parser before the one-pass scanner (``clover_agent/protocol.py`` at ``--baseline``) and now.

Usage: .venv/bin/python bench/parser_bench.py [--baseline REV] [--sizes 1K,10K,...] [--timeout S]
       [--no-write]
Each measurement runs in a fresh interpreter (so one parser's garbage never counts against the
other) with a limit on its wall time; a parser that runs past it at one size is not tried at larger
ones. Time is the CPU time of the parse (the machine is shared: CPU time moves less with the other
processes' load than wall time), the median of a few runs; memory is the peak of Python allocations
during one parse (tracemalloc), the input text excluded. Prints a Markdown section and (unless --no-write) puts it in
bench/RESULTS.md, replacing the previous parser section. The size limit of the strict reader is
lifted here (``max_chars=None``) to measure the scanner itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
START, END = "<!-- parser-bench:start -->", "<!-- parser-bench:end -->"
#: The last commit with the single-module parser (its candidate-end search).
BASELINE = "da20bd8"
SIZES = {"1K": 1 << 10, "10K": 10 << 10, "93K": 93 << 10, "1M": 1 << 20, "5M": 5 << 20, "20M": 20 << 20}
SHAPES = {
    "quoted": "one `editor create` whose file quotes complete calls (about 900 characters each), then a real call",
    "calls": "many small calls in one reply",
    "close-tags": "one value full of `</parameter>` / `</function>` lines",
    "prose": "plain text, no tags",
}

# Runs in the child: builds the reply, parses it, prints one JSON line. {module} and {shape} etc.
# are filled in by the parent.
CHILD = textwrap.dedent(
    """
    import importlib.util, json, statistics, sys, time, tracemalloc
    from clover_agent.protocol import ToolCall, format_tool_call
    from clover_agent.tools.registry import tool_specs

    source = {source!r}
    if source:
        spec = importlib.util.spec_from_file_location("protocol_before", source)
        protocol = importlib.util.module_from_spec(spec)
        sys.modules["protocol_before"] = protocol
        spec.loader.exec_module(protocol)
        parse = lambda text: protocol.parse_assistant(text, TOOLS)
    else:
        from clover_agent import protocol
        parse = lambda text: protocol.parse_assistant(text, TOOLS, max_chars=None)
    TOOLS = tool_specs()

    def create(path, text):
        return format_tool_call("editor", {{"command": "create", "path": path, "file_text": text}})

    def build(shape, size):
        if shape == "quoted":
            piece = "Example:\\n" + create("/workspace/example.sh", "echo hi\\n" * 100) + "\\n"
            body = piece * max(1, (size - 200) // len(piece))
            return create("/workspace/examples.md", body) + "\\n" + create("/workspace/next.txt", "x"), 2
        if shape == "calls":
            piece = create("/workspace/f.txt", "x") + "\\n"
            count = max(1, size // len(piece))
            return piece * count, count
        if shape == "close-tags":
            line = "</parameter>\\n</function>\\n"
            return create("/workspace/big.txt", line * max(1, size // len(line))), 1
        words = "The quick brown fox jumps over the lazy dog. "
        return words * max(1, size // len(words)), 0

    text, expected = build({shape!r}, {size})
    def calls():
        try:
            return len(parse(text).tool_calls)
        except Exception:  # the old parser gave up on thousands of calls with a format error
            return -1

    runs = []
    for _ in range({repeats}):
        start = time.process_time()
        found = calls()
        runs.append(time.process_time() - start)
    tracemalloc.start()
    calls()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({{"seconds": statistics.median(runs), "peak": peak, "chars": len(text),
                       "calls": found, "expected": expected}}))
    """
)


def measure(source: str, shape: str, size: int, timeout: float) -> dict[str, float] | None:
    """One measurement in a fresh interpreter; None when it ran past ``timeout`` seconds."""
    repeats = 5 if size <= 100_000 else 1
    code = CHILD.format(source=source, shape=shape, size=size, repeats=repeats)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as failed:
        raise SystemExit(f"the benchmark child failed:\n{failed.stderr}") from None
    return json.loads(done.stdout.strip().splitlines()[-1])


def seconds(value: float | None, timeout: float) -> str:
    if value is None:
        return f"> {timeout:.0f} s wall"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def peak(result: dict[str, float] | None) -> str:
    if result is None:
        return "—"
    kib = result["peak"] / 1024
    return f"{kib:.0f} KiB" if kib < 1024 else f"{kib / 1024:.1f} MiB"


def calls(result: dict[str, float] | None) -> str:
    if result is None:
        return "—"
    found = "format error" if result["calls"] < 0 else f"{result['calls']:.0f}"
    return found + ("" if result["calls"] == result["expected"] else f" (should be {result['expected']:.0f})")


def run(baseline: str, sizes: list[str], timeout: float) -> str:
    old = subprocess.run(
        ["git", "show", f"{baseline}:clover_agent/protocol.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    rows, per_million = [], []
    with tempfile.TemporaryDirectory() as folder:
        before_source = Path(folder) / "protocol_before.py"
        before_source.write_text(old)
        for shape in SHAPES:
            gave_up = {"before": False, "after": False}
            for label in sizes:
                size = SIZES[label]
                results = {}
                for name, source in (("before", str(before_source)), ("after", "")):
                    results[name] = None if gave_up[name] else measure(source, shape, size, timeout)
                    gave_up[name] = results[name] is None
                    print(f"{shape} {label} {name}: {results[name]}", file=sys.stderr, flush=True)
                before, after = results["before"], results["after"]
                ratio = "—"  # no speed-up over a parser that gave up or read the wrong calls
                if after is not None and before is not None and before["calls"] == before["expected"]:
                    speedup = before["seconds"] / max(after["seconds"], 1e-9)
                    ratio = f"{speedup:.0f}x" if speedup >= 10 else f"{speedup:.1f}x"
                if after is not None and size >= SIZES["1M"]:
                    per_million.append((shape, label, after["seconds"] / (after["chars"] / 1e6)))
                rows.append(
                    f"| {shape} | {label} | {seconds(before and before['seconds'], timeout)} | "
                    f"{seconds(after and after['seconds'], timeout)} | {ratio} | {peak(before)} | {peak(after)} | "
                    f"{calls(before)} | {calls(after)} |"
                )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    shapes = "\n".join(f"- `{name}`: {what}" for name, what in SHAPES.items())
    flat = "; ".join(
        f"{shape}: " + ", ".join(f"{t * 1000:.0f} ms at {label}" for s, label, t in per_million if s == shape)
        for shape in SHAPES
        if any(s == shape for s, _, _ in per_million)
    )
    return "\n".join(
        [
            START,
            "## Tool-call parser: time and memory vs reply size, before and after the one-pass scanner",
            "",
            f"- date: {now}; commit {commit} (before: `clover_agent/protocol.py` at {baseline})",
            f"- CPU: {cpu}; Python {platform.python_version()}; other processes shared the CPUs",
            f"- `.venv/bin/python bench/parser_bench.py`: CPU time of `parse_assistant`, median of 5 runs "
            f"up to 93K, one run above; peak = Python allocations during one parse; a measurement "
            f"is stopped after {timeout:.0f} s of wall time",
            "",
            shapes,
            "",
            "| shape | size | before | after | speed-up | before peak | after peak | before calls | after calls |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"After, CPU time per million characters from 1M up: {flat or 'n/a'} (what growth there is "
            "comes from memory at these sizes: 100K+ live calls, 20 MB strings; the scanner's work itself "
            "is counted, tag by tag, in tests/clover_agent/test_protocol_fuzz.py). Speed-up only where "
            "the parser before read the right calls; before, it gave up on hundreds of calls (a format "
            "error) and ran calls quoted in a value.",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit of the parser to compare with")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, from: " + ", ".join(SIZES))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds of wall time per measurement")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    section = run(args.baseline, args.sizes.split(","), args.timeout)
    print(section)
    if args.no_write:
        return
    current = RESULTS.read_text()
    if START in current and END in current:
        head, rest = current.split(START, 1)
        current = head + section + rest.split(END, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(current)


if __name__ == "__main__":
    main()
