"""``clover-agent generate``: one decoding call on the in-process engine (no agent, no tools).

Committed text is written to stderr as it is decided (live progress) and the answer to stdout;
``--json`` prints the tokens, text and statistics as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clover_agent.errors import ExitCode, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="decode a prompt with the in-process engine",
        description="Decode one prompt with the in-process block-diffusion engine and print the answer.",
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="checkpoint folder (config.json, *.safetensors)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (needs the checkpoint's tokenizer)")
    source.add_argument("--ids", help="prompt token ids, comma separated (e.g. 1,2,3)")
    parser.add_argument(
        "--chat", action="store_true", help="wrap --prompt as a user turn with the chat template"
    )
    parser.add_argument("--thinking", action="store_true", help="with --chat: open a <think> section")
    parser.add_argument(
        "--mode", choices=["diffusion", "self_speculative", "autoregressive"], default="diffusion"
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--greedy",
        action="store_true",
        help="greedy draws (default: Qwen's coding settings, temperature 0.6, top_p 0.95, top_k 20)",
    )
    parser.add_argument("--threshold", type=float, help="LowConfidence threshold (default: the checkpoint's)")
    parser.add_argument("--seed", type=int, help="seed of the sampling draws")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1...)")
    parser.add_argument("--json", action="store_true", help="print tokens, text and statistics as JSON")
    parser.set_defaults(func=run)


def _prompt_ids(args: argparse.Namespace, tokenizer) -> list[int]:
    if args.ids is not None:
        try:
            ids = [int(part) for part in args.ids.split(",") if part.strip()]
        except ValueError as exc:
            raise UsageError(f"--ids must be comma-separated integers: {exc}") from exc
        if args.chat:
            raise UsageError("--chat needs --prompt text, not --ids")
        return ids
    if tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer.json: pass --ids instead of --prompt")
    text = args.prompt
    if args.chat:
        messages = [{"role": "user", "content": text}]
        text = tokenizer.render_chat(messages, add_generation_prompt=True, enable_thinking=args.thinking)
    return tokenizer.encode(text)


def run(args: argparse.Namespace) -> int:
    from clover_agent.engine.decoding import CommittedBlock, Done
    from clover_agent.engine.engine import Engine
    from clover_agent.engine.sampling import SamplingParams

    engine = Engine.from_pretrained(
        args.model, device=args.device, progress=None if args.json else sys.stderr
    )
    prompt = _prompt_ids(args, engine.tokenizer)
    thinking = bool(args.chat and args.thinking)
    options = {"max_new_tokens": args.max_new_tokens, "mode": args.mode, "thinking": thinking}
    if args.threshold is not None:
        options["threshold"] = args.threshold
    if args.seed is not None:
        options["seed"] = args.seed
    try:
        params = SamplingParams.greedy(**options) if args.greedy else SamplingParams.coding(**options)
        events = engine.stream(prompt, params)
        result = None
        for event in events:
            if isinstance(event, CommittedBlock) and not args.json:
                piece = event.text if event.text is not None else " ".join(map(str, event.token_ids)) + " "
                print(piece, end="", file=sys.stderr, flush=True)
            elif isinstance(event, Done):
                result = event.result
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    assert result is not None
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text, **result.stats()}))
        return int(ExitCode.OK)
    stats = result.stats()
    print(
        f"\n[{stats['tokens']} tokens, {stats['finish_reason']}, {stats['forwards']} forwards, "
        f"{stats['tokens_per_forward']} tokens/forward, {stats['seconds']} s]",
        file=sys.stderr,
    )
    print(result.text if result.text is not None else " ".join(map(str, result.token_ids)))
    return int(ExitCode.OK)
