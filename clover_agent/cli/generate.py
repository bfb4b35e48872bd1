"""``clover-agent generate``: one decoding call on the in-process engine (no agent, no tools).

The answer is written once wherever it is read: at a terminal it streams to stdout as it is
decided; when stdout is a file or a pipe it streams to stderr (live progress) and the whole answer
goes to stdout at the end. The statistics (tokens, forwards, tokens per forward, tokens per second,
the time to the first block: the prefill) follow on stderr. ``--json`` prints the tokens, text,
statistics and the sampling parameters used as one JSON object instead. ``--device auto`` (the
default) is the CUDA GPU when torch sees one, else the CPU. Without ``--greedy`` the parameters
are ``SamplingParams.coding()`` (Qwen's thinking-mode coding settings); ``--greedy`` is
``SamplingParams.greedy()``, the same with temperature 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from clover_agent.engine.decoding.sampling import MODES
from clover_agent.errors import ExitCode, ModelUnavailable, UsageError
from clover_agent.safe_text import terminal_safe

if TYPE_CHECKING:
    import torch

    from clover_agent.engine.text.tokenizer import Tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="decode a prompt with the in-process engine",
        description="Decode one prompt with the in-process block-diffusion engine and print the answer. "
        "Block size and threshold come from the checkpoint's config.json unless given.",
        epilog="Exit codes: 0 done, 2 bad arguments (or --chat on a checkpoint without a chat template), "
        "3 the checkpoint cannot be loaded or the device is not available.",
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="checkpoint folder (config.json, *.safetensors)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (needs the checkpoint's tokenizer)")
    source.add_argument("--ids", help="prompt token ids, comma separated (e.g. 1,2,3)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="wrap --prompt as a user turn with the checkpoint's chat template",
    )
    parser.add_argument("--thinking", action="store_true", help="with --chat: open a <think> section")
    parser.add_argument(
        "--mode",
        choices=list(MODES),
        default="diffusion",
        help="diffusion: block diffusion (default); self_speculative: diffusion drafts verified "
        "causally, lossless (with --greedy the output equals greedy autoregressive decoding; sampled, "
        "it is distributed as autoregressive sampling); autoregressive: one token per forward",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        metavar="N",
        help="most tokens to generate, stop token excluded (default: 256; the context window caps it)",
    )
    parser.add_argument(
        "--greedy",
        action="store_true",
        help="greedy draws (default: Qwen's coding settings, temperature 0.6, top_p 0.95, top_k 20)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help="LowConfidence threshold in (0, 1] (default: the checkpoint's, else 0.95)",
    )
    parser.add_argument("--seed", type=int, help="seed of the sampling draws (default: 0)")
    parser.add_argument(
        "--device",
        default="auto",
        help="torch device: auto (a CUDA GPU when there is one, else the CPU; the default), cpu, cuda, cuda:1...",
    )
    parser.add_argument(
        "--json", action="store_true", help="print tokens, text, statistics and sampling parameters as JSON"
    )
    parser.set_defaults(func=run)


def _prompt_ids(args: argparse.Namespace, tokenizer: Tokenizer | None) -> list[int]:
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
        if tokenizer.chat_template is None:
            raise UsageError(
                f"{args.model} has no chat template (chat_template.jinja or tokenizer_config.json): "
                "drop --chat to decode the --prompt text as it is"
            )
        messages = [{"role": "user", "content": text}]
        text = tokenizer.render_chat(messages, add_generation_prompt=True, enable_thinking=args.thinking)
    return tokenizer.encode(text)


def _device(name: str) -> torch.device:
    """The torch device named by ``--device`` (``auto``: CUDA when available): a usage error when the
    name is not one, model unavailable when it names a CUDA GPU this machine does not have."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1...)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelUnavailable(f"--device {name}: no CUDA GPU is visible to torch here; use --device cpu")
    return device


def run(args: argparse.Namespace) -> int:
    from clover_agent.engine.decoding.sampling import SamplingParams
    from clover_agent.engine.decoding.stream import BlockCommitted, GenerationDone
    from clover_agent.engine.engine import Engine
    from clover_agent.engine.model.config import CloverConfig

    if args.thinking and not args.chat:
        raise UsageError("--thinking needs --chat (it opens <think> in the chat template's assistant turn)")
    device = _device(args.device)
    options: dict[str, object] = {
        "max_new_tokens": args.max_new_tokens,
        "mode": args.mode,
        "thinking": args.thinking,
    }
    if args.threshold is not None:
        options["threshold"] = args.threshold
    if args.seed is not None:
        options["seed"] = args.seed
    # The arguments are checked before the weights load (minutes for Clover itself): the sampling
    # parameters need only config.json, --ids no tokenizer.
    preset = SamplingParams.greedy if args.greedy else SamplingParams.coding
    try:
        params = preset(CloverConfig.from_file(args.model), **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    prompt = _prompt_ids(args, None) if args.ids is not None else None
    try:
        engine = Engine.from_pretrained(args.model, device=device, progress=None if args.json else sys.stderr)
    except RuntimeError as exc:  # the device cannot hold or run the model
        raise ModelUnavailable(f"cannot load {args.model} on {device}: {exc}") from exc
    # At a terminal the text streams to stdout and is not printed again; otherwise it streams to
    # stderr (progress) and stdout gets the whole answer at the end.
    at_terminal = sys.stdout.isatty()
    live = sys.stdout if at_terminal else sys.stderr
    line_open = False  # committed text not yet ended by a newline
    started = time.perf_counter()
    first_event: float | None = None
    try:
        prompt = prompt if prompt is not None else _prompt_ids(args, engine.tokenizer)
        result = None
        for event in engine.stream(prompt, params):
            if first_event is None:
                first_event = time.perf_counter() - started
            if isinstance(event, BlockCommitted) and not args.json:
                piece = event.text if event.text is not None else " ".join(map(str, event.token_ids)) + " "
                if piece:  # set before writing, so an interrupt during the write still ends the line
                    line_open = not piece.endswith("\n")
                # Pieces of lines, shown at a terminal or in the progress on stderr: never obeyed.
                print(terminal_safe(piece, workflow_commands=False), end="", file=live, flush=True)
            elif isinstance(event, GenerationDone):
                result = event.result
    except ValueError as exc:  # bad parameters or prompt (empty, outside the vocabulary, too long)
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt:
        if line_open:  # "interrupted" (printed by the CLI) goes on a line of its own
            print(file=live, flush=True)
        raise
    assert result is not None
    stats = result.stats()
    seconds = result.seconds or 0.0
    stats["tokens_per_second"] = round(len(result.token_ids) / seconds, 2) if seconds > 0 else 0.0
    stats["first_block_seconds"] = round(first_event if first_event is not None else seconds, 4)
    if args.json:
        report = {"token_ids": result.token_ids, "text": result.text, **stats, "device": str(device)}
        print(json.dumps(report | {"params": dataclasses.asdict(params)}))
        return int(ExitCode.OK)
    text = result.text if result.text is not None else " ".join(map(str, result.token_ids))
    if at_terminal:
        if line_open:
            print(flush=True)
    else:
        if line_open:
            print(file=sys.stderr, flush=True)
        print(text)
    print(
        f"[{stats['tokens']} tokens, {stats['finish_reason']}, {stats['forwards']} forwards, "
        f"{stats['tokens_per_forward']} tokens/forward, {stats['tokens_per_second']} tokens/s, "
        f"{stats['seconds']} s; first block after {stats['first_block_seconds']} s (the prefill)]",
        file=sys.stderr,
        flush=True,
    )
    return int(ExitCode.OK)
