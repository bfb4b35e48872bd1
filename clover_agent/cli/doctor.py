"""``clover-agent doctor``: what this machine has, what is missing, and what each gap blocks."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass

from clover_agent.engine.loading.locate import ModelSources
from clover_agent.errors import ExitCode, UsageError
from clover_agent.launch import BackendOptions, engine_experts, engine_experts_on, model_sources
from clover_agent.sandboxes.errors import SandboxUnavailable
from clover_agent.settings import Settings


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    blocks: str = ""  # what cannot work while this check fails
    required: bool = True  # part of the default path (engine + Docker sandbox)


def check_python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, f"{platform.python_version()} at {sys.executable}", "" if ok else "everything")


def check_torch_and_gpu(
    sources: ModelSources, experts: str = "auto", experts_on: str = "device"
) -> list[Check]:
    from clover_agent.backends.engine import engine_readiness
    from clover_agent.engine.loading.readiness import GiB

    try:
        import torch
    except ImportError as exc:
        return [Check("torch", False, str(exc), "the embedded engine")]
    cuda = torch.version.cuda or "none (CPU build)"
    checks = [Check("torch", True, f"{torch.__version__}, CUDA {cuda}")]
    report = engine_readiness(sources, experts, experts_on)
    gpu = report.gpu
    if gpu.available:
        checks.append(Check("gpu", True, f"{gpu.name}, {gpu.total_bytes / GiB:.1f} GiB"))
    else:
        checks.append(Check("gpu", False, gpu.reason, "the embedded engine (use --backend openai instead)"))
    if report.model.path:
        held = "" if experts == "auto" else f" with {experts} experts"
        held += " on the card, the routed experts in host memory" if experts_on == "host" else ""
        size = f", {report.weights_bytes / 1e9:.1f} GB{held}" if report.weights_bytes else ""
        checks.append(Check("weights", True, f"{report.model.path}{size}"))
    else:
        looked = "; ".join(f"{s}: {p} ({v})" for s, p, v in report.model.looked)
        checks.append(
            Check(
                "weights",
                False,
                f"not found (looked in {looked})",
                "the embedded engine (get them with `clover-agent model pull` or pass --model DIR)",
            )
        )
    memory_problems = [p for p in report.problems if p.startswith("GPU ")]
    if gpu.available and memory_problems:
        checks.append(Check("gpu-memory", False, memory_problems[0], "the embedded engine"))
    return checks


def check_triton() -> Check:
    try:
        import triton
    except ImportError as exc:
        return Check(
            "triton", False, str(exc), "fast GPU kernels (PyTorch fallbacks are used)", required=False
        )
    return Check("triton", True, triton.__version__, required=False)


def check_docker(image: str, docker_env: dict[str, str]) -> list[Check]:
    """Engine and image, through the same probes the Docker sandbox uses (same messages)."""
    from clover_agent.sandboxes.docker import docker_client, require_image

    blocks = "the Docker sandbox"
    try:
        client = docker_client(docker_env)
        version = client.version()
    except SandboxUnavailable as exc:
        return [
            Check("docker", False, exc.message, blocks),
            Check("sandbox-image", False, f"{image}: unknown (no engine)", blocks),
        ]
    checks = [Check("docker", True, f"engine {version.get('Version', '?')} ({client.api.base_url})")]
    try:
        require_image(client, image)
    except SandboxUnavailable as exc:
        return [*checks, Check("sandbox-image", False, exc.message, blocks)]
    from clover_agent.sandboxes.images import LABEL_UV

    inspected = client.api.inspect_image(image)
    short_id = inspected["Id"].split(":")[-1][:12]
    uv = ((inspected.get("Config") or {}).get("Labels") or {}).get(LABEL_UV, "none")
    installer = (
        f"uv {uv}"
        if uv != "none"
        else "no uv: environments are set up with pip; `clover-agent sandbox build` adds uv"
    )
    return [*checks, Check("sandbox-image", True, f"{image} ({short_id}; {installer})")]


def check_server(base_url: str, model_name: str | None, api_key: str | None) -> Check:
    """A model server (``clover-agent serve``, SGLang, ...): its health where it has ``/health``,
    and that it serves the model and takes the key (the check the openai backend makes before a run)."""
    import asyncio
    from urllib.parse import urlsplit

    from clover_agent.backends.base import BackendUnavailable
    from clover_agent.backends.openai import DEFAULT_MODEL_NAME, OpenAIBackend

    name = model_name or DEFAULT_MODEL_NAME
    blocks = "--backend openai with this server"
    try:
        backend = OpenAIBackend(base_url, model_name=name, api_key=api_key, connect_timeout=5.0, retries=0)
        health_path = urlsplit(backend.base_url).path.removesuffix("/v1") + "/health"
        status, body = backend.client.get(health_path, {})
        asyncio.run(backend.check())
    except (BackendUnavailable, UsageError) as exc:
        return Check("server", False, str(exc).splitlines()[0], blocks)
    health = {200: "healthy", 404: "no /health"}.get(status, f"/health answered {status}: {body[:80]!r}")
    if status == 503:
        return Check("server", False, f"{backend.base_url}: draining or not ready (/health 503)", blocks)
    return Check("server", True, f"{backend.base_url} serves {name!r} ({health})")


def run_checks(
    model: str | None = None, base_url: str | None = None, model_name: str | None = None
) -> list[Check]:
    """The checks of the default path; with ``base_url``, a model server instead of this machine's
    GPU and weights."""
    settings = Settings.load()
    checks = [check_python()]
    if base_url is not None:
        checks.append(check_server(base_url, model_name, settings.api_key))
    else:
        checks += check_torch_and_gpu(
            model_sources(settings, model),
            engine_experts(BackendOptions(), settings),
            engine_experts_on(BackendOptions(), settings),
        )
        checks.append(check_triton())
    checks += check_docker(settings.sandbox_image, settings.docker_env)
    return checks


def memory_plan(args: argparse.Namespace, checks: list[Check] | None) -> tuple[dict | None, list[str]]:
    """The memory plan (engine/memory_plan.py) for ``--card-gib`` or the card this machine has, of the
    weights found (Clover's published config when none are): its dict and its lines, or None and a
    line saying why there is none."""
    from clover_agent.engine.errors import CheckpointError
    from clover_agent.engine.loading.locate import locate_model
    from clover_agent.engine.loading.readiness import GiB, probe_gpu
    from clover_agent.engine.memory_plan import checkpoint_plan

    if args.card_gib is not None:
        card = int(args.card_gib * GiB)
    else:
        gpu = probe_gpu()
        if not gpu.available:
            return None, [f"memory plan: no CUDA GPU here ({gpu.reason}); plan for a card with --card-gib N"]
        card = gpu.total_bytes
    settings = Settings.load()
    model = locate_model(model_sources(settings, args.model)).path
    try:
        plan = checkpoint_plan(
            model,
            card_bytes=card,
            # the format asked for, else the one the engine would load (CLOVER_EXPERTS, [model] experts)
            experts=args.experts if args.experts != "auto" else engine_experts(BackendOptions(), settings),
            context_tokens=args.context,
            max_running=args.max_running,
            # where asked, else where the engine would put them (CLOVER_EXPERTS_ON, [model] experts_on)
            experts_on=args.experts_on or engine_experts_on(BackendOptions(), settings),
        )
    except (CheckpointError, ValueError) as exc:
        return None, [f"memory plan: {exc}"]
    source = f"weights in {model}" if model else "Clover-35B-A3B's published config (no weights found)"
    lines = plan.lines()
    lines.insert(1, f"  for {source}")
    if checks is not None:
        card_gib = f"{card / GiB:.1f} GiB card"
        detail = (
            f"{card_gib}: {plan.max_running} request(s) at {plan.context_tokens:,} tokens, "
            f"routed experts {plan.experts}"
            if plan.fits
            else f"{card_gib}: does not fit; {'; '.join(plan.suggestions) or 'nothing smaller fits'}"
        )
        checks.append(Check("memory-plan", plan.fits, detail, "serving on this card", required=False))
    return plan.to_dict(), lines


def _doctor(args: argparse.Namespace) -> int:
    if args.plan:
        plan, lines = memory_plan(args, None)
        if args.json:
            print(json.dumps({"memory_plan": plan, "lines": lines}, indent=2))
        else:
            print("\n".join(lines))
        return ExitCode.OK if plan is not None and plan["fits"] else ExitCode.FAILURE
    checks = run_checks(args.model, args.base_url, args.model_name)
    # a model server's card is its own: this machine's plan says nothing about it
    plan, lines = (None, []) if args.base_url else memory_plan(args, checks)
    ready = all(c.ok for c in checks if c.required)
    path = "model server + Docker sandbox" if args.base_url else "embedded engine + Docker sandbox"
    if args.json:
        print(
            json.dumps({"ready": ready, "checks": [asdict(c) for c in checks], "memory_plan": plan}, indent=2)
        )
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("MISS" if c.required else "warn")
            print(f"[{mark}] {c.name:<14} {c.detail}")
            if not c.ok and c.blocks:
                print(f"       {'':<14} blocks: {c.blocks}")
        print()
        if lines:
            print("\n".join(lines))
            print()
        if ready:
            print(f"Ready: the path ({path}) can run.")
        else:
            print(f"Not ready for the path ({path}).")
            print(
                "Alternatives: --backend openai --base-url URL (a Clover server such as SGLang); --sandbox local."
            )
    return ExitCode.OK if ready else ExitCode.FAILURE


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check GPU, weights, Docker and the sandbox image; plan the card's memory",
        description="Check what the default path (embedded engine + Docker sandbox) needs, and print the "
        "memory plan for the card (weights by expert format, per-request state, the requests that fit; "
        "docs/serving.md). Exit 0 when ready, 1 otherwise; with --plan, 0 when the plan fits.",
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--model", metavar="DIR", help="weights folder to check instead of the default lookup")
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="check this model server (e.g. clover-agent serve: http://HOST:8000/v1; health, models, API key "
        "from CLOVER_API_KEY) instead of this machine's GPU and weights",
    )
    p.add_argument(
        "--model-name", metavar="NAME", help="with --base-url: the model to expect (default: clover)"
    )
    p.add_argument(
        "--plan", action="store_true", help="print only the memory plan (no GPU needed with --card-gib)"
    )
    p.add_argument(
        "--card-gib",
        type=_positive_float,
        metavar="N",
        help="plan for a card of N GiB instead of the one this machine has",
    )
    p.add_argument(
        "--experts",
        choices=("auto", "bf16", "fp8", "int4"),
        default="auto",
        help="routed experts' format to plan for (auto: as the engine would load them, CLOVER_EXPERTS or "
        "[model] experts, else as the checkpoint stores them)",
    )
    p.add_argument(
        "--experts-on",
        choices=("device", "host"),
        help="where the routed experts are planned: device (on the card) or host (host memory, computed "
        "by the CPU; default: CLOVER_EXPERTS_ON, [model] experts_on, else device)",
    )
    p.add_argument(
        "--context", type=_positive_int, metavar="N", help="tokens per request to plan for (default 32768)"
    )
    p.add_argument(
        "--max-running",
        type=_positive_int,
        metavar="N",
        help="requests decoded together to plan for (default: the most that fit)",
    )
    p.set_defaults(func=_doctor)
