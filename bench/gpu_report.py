"""The Markdown section ``gpu_bench.py`` prints for bench/RESULTS.md, from its JSON report."""

from __future__ import annotations

from typing import Any

SECTION_START = "<!-- gpu-bench:start -->"
SECTION_END = "<!-- gpu-bench:end -->"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _kernels(kernels: dict[str, Any]) -> list[str]:
    if "unavailable" in kernels:
        return ["", f"Triton kernels: not run ({kernels['unavailable']})."]
    lines = (
        ["", f"Triton kernels in the interpreter: {kernels['interpreter']}."]
        if "interpreter" in kernels
        else []
    )
    lines += [
        "",
        "| kernel | shape | rel. error (bound) | median µs | GB/s | share of copy bandwidth "
        "| PyTorch reference µs | speed-up |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in kernels["rows"]:
        if "error" in row:
            lines.append(f"| {row['name']} | {row['shape']} | FAILED: {row['error']} | | | | | |")
            continue
        error = (
            "draw (no exact reference)" if row["relative_error"] is None else f"{row['relative_error']:.1e}"
        )
        over = " OVER" if row["within_bound"] is False else ""
        reference = row.get("reference_ms")
        speedup = row.get("speedup")
        lines.append(
            f"| {row['name']} | {row['shape']} | {error} ({row['bound']:.0e}){over} | {row['median_ms'] * 1e3:,.1f} | "
            f"{_fmt(row['gb_per_s'], ',.1f')} | {_fmt(row.get('share_of_copy_bandwidth'), '.2f')} | "
            f"{_fmt(None if reference is None else reference * 1e3, ',.1f')} | "
            f"{'-' if speedup is None else f'{speedup:.2f}x'} |"
        )
    return lines


def _model(model: dict[str, Any]) -> list[str]:
    shape = model["shape"]
    what = (
        f"RANDOM weights built on the device in {model['build_s']:.1f} s"
        if model["source"] == "random"
        else f"weights from {model['path']}, loaded in {model['build_s']:.1f} s"
    )
    return [
        "",
        f"Model: {what}: {shape['layers']} layers, hidden {shape['hidden_size']}, {shape['experts']} experts "
        f"top-{shape['experts_per_token']}, vocabulary {shape['vocab_size']:,}, {model['parameters']:,} "
        f"parameters ({model['dtype']}, {model['bytes'] / 1e9:.1f} GB); operators: "
        + ", ".join(f"{op} {backend}" for op, backend in model["operators"].items()),
    ]


def _steps(steps: dict[str, dict[str, Any]], context: int) -> list[str]:
    lines = [
        "",
        f"| step at {context} committed tokens | median ms | floor ms | over floor | CUDA graph ms | graph over floor "
        "| bytes touched GB | experts/layer | ATen ops | CUDA kernels |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in steps.items():
        if "error" in row:
            lines.append(f"| {name} | FAILED: {row['error']} | | | | | | | | |")
            continue
        graph = _fmt(row.get("graph_ms"), ".2f") if "graph_error" not in row else "failed"
        lines.append(
            f"| {name} | {row['median_ms']:.2f} | {_fmt(row.get('floor_ms'), '.2f')} | "
            f"{_fmt(row.get('over_floor'), '.2f')} | {graph} | {_fmt(row.get('graph_over_floor'), '.2f')} | "
            f"{row['bytes']['total'] / 1e9:.2f} | {row['bytes']['experts_per_layer']} | {row['operators']:,} | "
            f"{_fmt(row.get('cuda_kernels'), ',')} |"
        )
    failed = [f"{name}: {row['graph_error']}" for name, row in steps.items() if "graph_error" in row]
    if failed:
        lines += ["", "CUDA graph failures: " + "; ".join(failed)]
    return lines


def _rates(rows: list[dict[str, Any]], source: str) -> list[str]:
    lines = [
        "",
        f"Tokens/s from the step times; tokens per forward {source}:",
        "",
        "| tokens per forward | diffusion | diffusion, fused commit | self-speculative | autoregressive |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['tokens_per_forward']} | {_fmt(row.get('diffusion'), ',.0f')} | "
            f"{_fmt(row.get('diffusion_fused'), ',.0f')} | {_fmt(row.get('self_speculative'), ',.0f')} | "
            f"{_fmt(row.get('autoregressive'), ',.0f')} |"
        )
    return lines


def _decode(decode: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "| end-to-end greedy decode | tokens | forwards | tokens per forward | ms per forward | tokens/s "
        "| tokens/s, CUDA graphs | same tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for mode, row in decode.items():
        graphs = "failed" if "graph_error" in row else _fmt(row.get("graph_tokens_per_s"), ".1f")
        lines.append(
            f"| {mode} | {row['tokens']} | {row['forwards']} | {row['tokens_per_forward']:.2f} | "
            f"{row['ms_per_forward']:.2f} | {row['tokens_per_s']:.1f} | {graphs} | {row.get('graph_same_tokens', '-')} |"
        )
    failed = [f"{mode}: {row['graph_error']}" for mode, row in decode.items() if "graph_error" in row]
    if failed:
        lines += ["", "CUDA-graph decode failures: " + "; ".join(failed)]
    return lines


def _prefill(prefill: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Prompt prefill, {prefill['tokens']:,} tokens in chunks of {prefill['chunk']:,} (median of runs):",
        "",
        "| run | operators | seconds | tokens/s |",
        "| --- | --- | ---: | ---: |",
    ]
    for label, what in (("model", "the model's operators"), ("torch_reference", "PyTorch reference")):
        if label in prefill:
            row = prefill[label]
            lines.append(
                f"| {what} | {row['operators']} | {row['seconds']:.3f} | {row['tokens_per_s']:,.0f} |"
            )
    if "speedup" in prefill:
        lines += ["", f"Kernels over the PyTorch operators: {prefill['speedup']:.2f}x."]
    return lines


def _moe_tiles(tiles: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Expert GEMM tiles tuned (table: {tiles['table']}):",
        "",
        "| format | tokens | best (m, n, k, warps, stages) | ms | heuristic ms | speed-up | dropped |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in tiles["rows"]:
        if "error" in row:
            lines.append(
                f"| {row['quant']} | {row['tokens']} | {row['error']} | | | | {len(row['dropped'])} |"
            )
            continue
        best = ", ".join(str(v) for v in row["best"].values())
        lines.append(
            f"| {row['quant']} | {row['tokens']} | {best} | {row['best_ms']:.3f} | {row['default_ms']:.3f} | "
            f"{row['speedup']:.2f}x | {len(row['dropped'])} |"
        )
    return lines


def _agent(agent: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"The agent's path (one decoder, prefix cache, CUDA graphs {'on' if agent['cuda_graphs'] else 'off'}):",
        "",
        "| turn | prompt tokens | reused | tokens | first block s | decode tokens/s | tokens per forward "
        "| graph captures | graph replays | of them passes with their choice | finished |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for turn in ("first_turn", "second_turn"):
        if turn not in agent:
            continue
        row = agent[turn]
        lines.append(
            f"| {turn.replace('_', ' ')} | {row['prompt_tokens']:,} | {_fmt(row.get('reused_tokens'), ',')} | "
            f"{row['tokens']:,} | {_fmt(row['first_block_s'], '.3f')} | {_fmt(row.get('decode_tokens_per_s'), ',.1f')} | "
            f"{_fmt(row.get('tokens_per_forward'), '.2f')} | {_fmt(row.get('graph_captures'), 'd')} | "
            f"{_fmt(row.get('graph_replays'), ',')} | {_fmt(row.get('graph_pass_replays'), ',')} | {row['finished']} |"
        )
    failures = {
        k: v
        for turn in ("first_turn", "second_turn")
        for k, v in agent.get(turn, {}).get("graph_failures", {}).items()
    }
    if failures:
        lines += [
            "",
            "Steps left eager, their capture failed: " + "; ".join(f"{k}: {v}" for k, v in failures.items()),
        ]
    versus = agent.get("graphs_vs_eager")
    if versus:
        how = "rehearsed graphs" if versus["rehearsed"] else "CUDA graphs"
        same = (
            "the same tokens"
            if versus["same"]
            else f"tokens differ from position {versus['first_difference']}"
        )
        lines += [
            "",
            f"A greedy call of {versus['tokens']} tokens on {how} ({versus['pass_replays']} passes replayed "
            f"with their token choice) against eager steps: {same}.",
        ]
    return lines


def _batched(steps: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Batched steps (issue 40): B requests at {steps['context']:,} committed tokens each, one 32-token "
        f"denoising pass each; one request's pass alone {_fmt(steps.get('one_ms'), '.2f')} ms "
        f"(caches {steps['cache_bytes_per_request'] / 1e6:,.0f} MB per request):",
        "",
        "| requests | packed ms | one by one ms | floor ms (one request, same tokens) | passes/s "
        "| pass work vs one request |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in steps["rows"]:
        lines.append(
            f"| {row['requests']} | {row['packed_ms']:.2f} | {row['one_by_one_ms']:.2f} | {row['floor_ms']:.2f} | "
            f"{row['passes_per_s']:,.0f} | {row['vs_one']:.2f}x |"
        )
    if steps.get("left_out"):
        lines += ["", f"Left out (their caches would not fit): {steps['left_out']}."]
    return lines


def _batch_engine(batch: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"BatchEngine: N concurrent greedy calls, {batch['prompt_tokens']:,}-token prompts, "
        f"{batch['new_tokens']} new tokens each (random weights: about one token per pass):",
        "",
        "| calls | wall s | request forwards/s | vs one call | forwards per step | tokens per forward |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in batch["rows"]:
        lines.append(
            f"| {row['requests']} | {row['wall_s']:.2f} | {row['forwards_per_s']:,.1f} | "
            f"{_fmt(row.get('vs_one'), '.2f')}x | {row['forwards_per_step']:.1f} | {row['tokens_per_forward']:.2f} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    where = (
        f"{m['gpu']}, {m['gpu_memory_gib']} GiB; torch {m['torch']}, CUDA {m['cuda']}, triton {m['triton']}"
        if "gpu" in m
        else f"CPU ({m['cpu']}, {m['cpu_threads']} threads); torch {m['torch']}"
    )
    lines = [
        SECTION_START,
        "## GPU benchmark: kernels, decoding steps against the memory floor, decoding modes",
        "",
        f"- date: {m['date']}; commit {m['commit']}; {m['device']}: {where}",
    ]
    if report.get("copy_bandwidth"):
        lines.append(f"- copy bandwidth (read + written): {report['copy_bandwidth']['gb_per_s']:,.0f} GB/s")
    if report.get("kernels"):
        lines += _kernels(report["kernels"])
    if report.get("model"):
        lines += _model(report["model"])
    if report.get("steps"):
        lines += _steps(report["steps"], report["settings"]["context"])
    if report.get("mode_rates"):
        lines += _rates(report["mode_rates"], report["tokens_per_forward_source"])
    if report.get("decode"):
        lines += _decode(report["decode"])
    if report.get("moe_tiles"):
        lines += _moe_tiles(report["moe_tiles"])
    if report.get("batched_steps"):
        lines += _batched(report["batched_steps"])
    if report.get("batch_engine"):
        lines += _batch_engine(report["batch_engine"])
    if report.get("prefill"):
        lines += _prefill(report["prefill"])
    if report.get("agent_path"):
        lines += _agent(report["agent_path"])
    for scheme in ("fp8", "int4"):
        if report.get(f"steps_{scheme}"):
            made = report[f"experts_{scheme}"]
            lines += [
                "",
                f"Routed experts as {scheme.upper()} (scales per {made['block'][0]} x {made['block'][1]}; "
                f"{made['routed_experts_bytes'] / 1e9:.2f} GB, quantised in {made['seconds']:.1f} s):",
            ]
            lines += _steps(report[f"steps_{scheme}"], report["settings"]["context"])
        if report.get(f"mode_rates_{scheme}"):
            lines += _rates(report[f"mode_rates_{scheme}"], report["tokens_per_forward_source"])
    memory = f"process RSS {report['peak_rss_mib']:,.0f} MiB"
    if "cuda_peak_allocated_gib" in report:
        memory = f"CUDA allocator peak {report['cuda_peak_allocated_gib']:.1f} GiB; " + memory
    budget = report["budget"]
    lines += ["", f"Peak memory: {memory}. Budget {budget['seconds']:.0f} s, used {budget['used_s']:.0f} s."]
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"]) + "."]
    if report["errors"]:
        lines += ["", "Errors: " + "; ".join(report["errors"])]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"
