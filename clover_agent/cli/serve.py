"""``clover-agent serve``: Clover behind an OpenAI-compatible server for a team (docs/backends.md,
"clover-agent serve"). The checkpoint is found as the other commands find it and loaded before
the server listens; the device is the engine backend's choice."""

from __future__ import annotations

import argparse
import sys

from clover_agent.cli.options import positive
from clover_agent.engine.loading.readiness import EXPERT_CHOICES, EXPERT_PLACES
from clover_agent.errors import ExitCode


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535 (refused here, before the load)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535 (got {text})")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve Clover over an OpenAI-compatible HTTP API",
        description="Load Clover once and serve it to many clients (TUIs, editors, the CI bot, eval) "
        "over /v1/chat/completions, /v1/models, /health and /metrics; requests are decoded together. "
        "Clients use it with --backend openai --base-url http://HOST:PORT/v1.",
        epilog="Exit codes: 0 stopped (after SIGTERM's drain), 2 bad arguments (or no API key on a "
        "non-loopback address), 3 the checkpoint cannot be found or loaded.",
    )
    parser.add_argument(
        "--model", metavar="DIR", help="Clover weights folder (default: CLOVER_MODEL, the config)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=port, default=8000, help="port (default: 8000; 0: any free one, printed)"
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help="key clients must send (Authorization: Bearer KEY; default: CLOVER_API_KEY, better: a command "
        "line is visible to the machine's other users); required unless --host is a loopback address",
    )
    parser.add_argument(
        "--max-running",
        type=positive(int),
        metavar="N",
        help="requests decoded together (default: on a GPU the most the card's memory plan fits, docs/serving.md; "
        "on the CPU 8)",
    )
    parser.add_argument(
        "--context",
        type=positive(int),
        metavar="N",
        help="tokens a conversation may reach, prompt and answer (default: 32768, or the model's window if "
        "shorter); the memory plan is for this, and a longer prompt is refused",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        default=64,
        metavar="N",
        help="requests that may wait; one more is answered 429 with Retry-After (default: 64)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive(int),
        default=8192,
        metavar="N",
        help="most tokens an answer may take, reasoning included; a request's max_tokens is capped by it "
        "(default: 8192; the context window caps it further)",
    )
    parser.add_argument(
        "--device",
        help="torch device (default: a GPU with room for the weights, else the CPU for small ones)",
    )
    parser.add_argument(
        "--experts",
        choices=EXPERT_CHOICES,
        help="how the routed experts are held: auto (as stored), dense, or fp8 / int4 quantised while "
        "loading, which is what fits a 48 or 24 GB card (default: CLOVER_EXPERTS, [model] experts, auto; "
        "`clover-agent doctor --plan --experts int4` shows the plan first)",
    )
    parser.add_argument(
        "--experts-on",
        choices=EXPERT_PLACES,
        help="where the routed experts are: device (the GPU, with the rest) or host (host memory, computed "
        "by the CPU: fits a 16 GB card, but each forward is many times slower and decoding runs without "
        "CUDA graphs; docs/serving.md) (default: CLOVER_EXPERTS_ON, [model] experts_on, device)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=positive(float),
        default=60.0,
        metavar="S",
        help="on SIGTERM, seconds running requests may take to finish (default: 60)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_agent.backends.engine import EngineBackend
    from clover_agent.engine.batching import BatchEngine
    from clover_agent.engine.loading.readiness import probe_gpu
    from clover_agent.engine.memory_plan import DEFAULT_CONTEXT_TOKENS
    from clover_agent.errors import UsageError
    from clover_agent.launch import BackendOptions, engine_experts, engine_experts_on, model_sources
    from clover_agent.serve.app import Served
    from clover_agent.serve.server import check_api_key, serve
    from clover_agent.serve.sizing import concurrency
    from clover_agent.settings import Settings

    if args.max_queued < 0:
        raise UsageError("--max-queued must be 0 or more")
    settings = Settings.load()
    api_key = args.api_key if args.api_key is not None else settings.serve_api_key
    check_api_key(args.host, api_key)  # before the minutes a load can take
    chosen = {"experts": args.experts, "experts_on": args.experts_on}
    options = BackendOptions(engine_options={k: v for k, v in chosen.items() if v})
    experts, experts_on = engine_experts(options, settings), engine_experts_on(options, settings)
    backend = EngineBackend(
        sources=model_sources(settings, args.model),
        device=args.device,
        experts=experts,
        experts_on=experts_on,
        progress=sys.stderr,
    )
    context = min(args.context or DEFAULT_CONTEXT_TOKENS, backend.context_window)
    card = probe_gpu().total_bytes if backend.device.startswith("cuda") else None
    running, plan = concurrency(
        backend.model_dir,
        card_bytes=card,
        max_running=args.max_running,
        context_tokens=context,
        experts=experts,
        experts_on=experts_on,
    )
    print("\n".join(plan), file=sys.stderr, flush=True)
    batch = BatchEngine(backend.load_now(), max_running=running, max_queued=args.max_queued)
    served = Served(
        backend, batch, api_key=api_key, max_new_tokens=args.max_new_tokens, context_tokens=context
    )
    serve(served, args.host, args.port, drain_timeout=args.drain_timeout)
    return int(ExitCode.OK)
