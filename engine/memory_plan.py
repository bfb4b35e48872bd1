"""How Clover fits one card: weights by part, each request's state, activations, reserves, and the
concurrency that fits (docs/serving.md, "Sizing"), from the checkpoint's :class:`CloverConfig` and
the expert formats the loader really holds. The stable API for ``serve`` and ``doctor``::

    plan = plan_memory(config, card_bytes=24 * GiB, experts="int4", context_tokens=32768)
    plan.fits, plan.max_running, plan.suggestions, plan.lines(), plan.to_dict()

``max_running=None`` chooses the concurrency (the most requests that fit at the context length);
a plan that does not fit names what would (smaller expert formats, fewer requests, a shorter
context, routed experts in host memory with its cost). ``checkpoint_plan`` plans a folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from clover_agent.engine.batching import DEFAULT_PREFILL_CHUNK
from clover_agent.engine.decoding.prefix_cache import DEFAULT_MAX_BYTES
from clover_agent.engine.loading.readiness import checkpoint_bytes
from clover_agent.engine.loading.weights import fp8_block_of, plan_load, read_tensor_index
from clover_agent.engine.model.config import CloverConfig, full_size_config_json
from clover_agent.engine.model.quantized import FP8_BLOCK, INT4_GROUP

ExpertFormat = Literal["bf16", "fp8", "int4"]
EXPERT_FORMATS: tuple[ExpertFormat, ...] = get_args(ExpertFormat)

GiB = 1024**3
MiB = 1024**2
#: The engine serves in bf16: every weight outside the quantised experts, the K/V and the conv state.
DTYPE_BYTES = 2
#: Context planned for when none is given (an agent's conversation; capped by the model's window).
DEFAULT_CONTEXT_TOKENS = 32768
#: CUDA context, cuBLAS and Triton workspaces: allowance, not measured.
CUDA_CONTEXT_BYTES = 1 * GiB
#: Share of the card the caching allocator loses to fragmentation: allowance.
FRAGMENTATION_SHARE = 0.05
#: Fixed part of the CUDA graph allowance (graph objects, per-bucket static inputs and outputs).
GRAPH_POOL_FIXED_BYTES = 256 * MiB
#: The prefix cache gets its default budget or this share of the card, whichever is smaller.
PREFIX_CACHE_SHARE = 0.05
#: Host-to-GPU bandwidth assumed for routed experts streamed from host memory (PCIe 4.0 x16 in
#: practice): the comparison for the variant that copies them to the card, which is not built.
PCIE_BYTES_PER_S = 25e9
#: Most requests a plan chooses.
MAX_PLANNED_REQUESTS = 1024


def routed_expert_bytes(
    config: CloverConfig,
    experts: ExpertFormat,
    *,
    int4_group: int = INT4_GROUP,
    fp8_block: tuple[int, int] = FP8_BLOCK,
) -> int:
    """Bytes of ONE routed expert (gate, up and down matrices with their scales) in ``experts``."""
    hidden, inner = config.hidden_size, config.moe_intermediate_size
    total = 0
    for rows, cols in ((inner, hidden), (inner, hidden), (hidden, inner)):  # gate, up, down
        if experts == "bf16":
            total += rows * cols * DTYPE_BYTES
        elif experts == "fp8":  # e4m3 bytes + a float32 scale per block (partial blocks too)
            total += rows * cols + math.ceil(rows / fp8_block[0]) * math.ceil(cols / fp8_block[1]) * 4
        elif experts == "int4":  # two weights a byte along the inputs + a float16 scale per group
            total += rows * math.ceil(cols / 2) + rows * math.ceil(cols / int4_group) * 2
        else:
            raise ValueError(f"unknown expert format {experts!r} (choose from {', '.join(EXPERT_FORMATS)})")
    return total


def weight_bytes(
    config: CloverConfig,
    experts: ExpertFormat,
    *,
    int4_group: int = INT4_GROUP,
    fp8_block: tuple[int, int] = FP8_BLOCK,
) -> dict[str, int]:
    """The model's weights on the card, by part (bytes)."""
    c, d = config, DTYPE_BYTES
    hidden, layers = c.hidden_size, c.num_hidden_layers
    full = c.layer_types.count("full_attention")
    linear = c.layer_types.count("linear_attention")
    q_rows = c.num_attention_heads * c.head_dim
    attention = hidden * 2 * q_rows + 2 * hidden * c.num_key_value_heads * c.head_dim + q_rows * hidden
    attention += 2 * c.head_dim  # q and k norms
    heads = c.linear_num_value_heads
    gdn = hidden * (c.conv_dim + c.linear_value_dim + 2 * heads)  # in_proj_qkv, z, b, a
    gdn += c.conv_dim * c.linear_conv_kernel_dim + 2 * heads + c.linear_value_head_dim  # conv, dt, A, norm
    gdn += c.linear_value_dim * hidden  # out_proj
    if c.bidirectional_gdn:
        gdn += c.conv_dim * c.right_conv_kernel_size + 2 * heads
    return {
        "embedding": c.vocab_size * hidden * d,
        "LM head": 0 if c.tie_word_embeddings else c.vocab_size * hidden * d,
        "attention": full * attention * d,
        "gated deltanet": linear * gdn * d,
        "norms": (2 * layers + 1) * hidden * d,
        "router": layers * (c.num_experts + 1) * hidden * d,  # router + shared-expert gate
        "shared experts": layers * 3 * hidden * c.shared_expert_intermediate_size * d,
        "routed experts": layers
        * c.num_experts
        * routed_expert_bytes(c, experts, int4_group=int4_group, fp8_block=fp8_block),
    }


def request_bytes(config: CloverConfig, context_tokens: int) -> dict[str, int]:
    """One running request's state at ``context_tokens`` (bytes): attention K/V with room for the two
    blocks a step writes past the context, each GDN layer's float32 recurrent and conv state, and
    its decoding workspace (a block's float32 logits and their softmax)."""
    c = config
    rows = context_tokens + 2 * c.block_size
    full = c.layer_types.count("full_attention")
    linear = c.layer_types.count("linear_attention")
    recurrent = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    conv = c.conv_dim * (c.linear_conv_kernel_dim - 1) * DTYPE_BYTES
    return {
        "attention K/V": 2 * full * c.num_key_value_heads * c.head_dim * DTYPE_BYTES * rows,
        "GDN state": linear * (recurrent + conv),
        "decoding workspace": 2 * c.block_size * c.vocab_size * 4,
    }


def activation_bytes(config: CloverConfig, tokens: int) -> int:
    """Estimated peak of one forward over ``tokens`` packed tokens: the residual stream plus the
    largest layer's intermediates (GDN projections, conv and chunked scan, attention q/k/v and output
    with a fused attention kernel, or the MoE's router logits and each token's top-k expert rows)."""
    c, d, t = config, DTYPE_BYTES, tokens
    residual = 3 * t * c.hidden_size * d
    heads = c.linear_num_value_heads
    directions = 2 if c.bidirectional_gdn else 1
    gdn = t * (c.conv_dim + c.linear_value_dim + 2 * heads) * d + t * c.conv_dim * d  # projections, conv
    gdn += t * heads * (c.linear_key_head_dim + c.linear_value_head_dim) * d  # the chunked scan's w, u
    gdn += t * c.linear_value_dim * (4 * directions + d)  # float32 scan output(s), gated norm
    q_rows = c.num_attention_heads * c.head_dim
    attention = t * (2 * q_rows + 2 * c.num_key_value_heads * c.head_dim) * d + t * q_rows * 4
    routed = t * c.num_experts_per_tok
    moe = t * c.num_experts * 4 + routed * (c.hidden_size + 3 * c.moe_intermediate_size) * d
    moe += routed * c.hidden_size * 4 + t * 3 * c.shared_expert_intermediate_size * d
    return residual + max(gdn, attention, moe)


def forward_tokens(config: CloverConfig, running: int, context_tokens: int, prefill_chunk: int) -> int:
    """Tokens in the largest packed step of ``running`` requests (``BatchEngine``: one parked
    forward each): every one of them prefilling a chunk, as when many arrive together, or
    decoding two blocks (a commit fused with the next block's first pass), whichever is more."""
    return running * max(min(prefill_chunk, context_tokens), 2 * config.block_size)


def host_expert_traffic(config: CloverConfig, experts: ExpertFormat, tokens: int) -> int:
    """Expected bytes of routed experts one forward over ``tokens`` tokens reads, every layer, if
    they are streamed from host memory: the distinct experts its tokens pick under uniform routing
    (``E * (1 - (1 - k/E)^tokens)`` per layer; real routing is skewed, so fewer)."""
    e, k = config.num_experts, config.num_experts_per_tok
    distinct = e * (1 - (1 - k / e) ** tokens)
    return round(config.num_hidden_layers * distinct * routed_expert_bytes(config, experts))


@dataclass(frozen=True)
class MemoryPlan:
    """One card's budget: parts in bytes, the concurrency and, when it does not fit, what would."""

    card_bytes: int
    experts: ExpertFormat
    context_tokens: int
    weights: dict[str, int]
    per_request: dict[str, int]
    #: Requests planned for: as asked, or chosen (the most that fit; 0 when none does, the parts
    #: then priced for one).
    max_running: int
    activations: int
    graph_pools: int
    headroom: int
    prefix_cache: int
    #: The prefix cache got less than its budget so that the requests fit.
    prefix_cache_shrunk: bool = False
    #: Planned with the routed experts in host memory (``experts_on="host"``: computed by the CPU;
    #: ``weights`` holds none of them).
    host_experts: bool = False
    suggestions: list[str] = field(default_factory=list)

    @property
    def weights_total(self) -> int:
        return sum(self.weights.values())

    @property
    def request_total(self) -> int:
        return sum(self.per_request.values())

    @property
    def total_bytes(self) -> int:
        running = max(self.max_running, 1)  # a plan that fits nothing still shows one request's cost
        return (
            self.weights_total
            + running * self.request_total
            + self.activations
            + self.graph_pools
            + self.headroom
            + self.prefix_cache
        )

    @property
    def fits(self) -> bool:
        return self.max_running >= 1 and self.total_bytes <= self.card_bytes

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) of every line of the table, parts indented under their group."""
        running = max(self.max_running, 1)
        where = " in host memory" if self.host_experts else ""
        out = [(f"weights (routed experts {self.experts}{where})", self.weights_total)]
        out += [(f"  {name}", size) for name, size in self.weights.items() if size]
        out.append((f"requests: {running} x {_gib(self.request_total)} GiB", running * self.request_total))
        out += [(f"  {name} (each)", size) for name, size in self.per_request.items()]
        out += [
            ("activations (one packed forward)", self.activations),
            ("CUDA graph pools (allowance)", self.graph_pools),
            ("CUDA context + allocator headroom", self.headroom),
            (
                "prefix cache" + (" (shrunk to fit)" if self.prefix_cache_shrunk else " budget"),
                self.prefix_cache,
            ),
        ]
        return out

    def lines(self) -> list[str]:
        """The plan as a short table for a terminal."""
        head = (
            f"memory plan: {_gib(self.card_bytes)} GiB card, routed experts {self.experts}, "
            f"context {self.context_tokens:,} tokens"
        )
        out = [head] + [f"  {label:<40} {_gib(size):>7} GiB" for label, size in self.rows()]
        out.append(f"  {'total':<40} {_gib(self.total_bytes):>7} GiB of {_gib(self.card_bytes)}")
        if self.fits:
            out.append(f"  fits: {self.max_running} request(s) at {self.context_tokens:,} tokens")
        else:
            out.append(
                f"  does not fit {max(self.max_running, 1)} request(s) at {self.context_tokens:,} tokens"
            )
        if self.suggestions:
            out.append("  what would fit:" if not self.fits else "  other options:")
            out += [f"    - {s}" for s in self.suggestions]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The plan for JSON (bytes, with the totals and the verdict)."""
        return {
            "card_bytes": self.card_bytes,
            "experts": self.experts,
            "context_tokens": self.context_tokens,
            "max_running": self.max_running,
            "fits": self.fits,
            "total_bytes": self.total_bytes,
            "weights": dict(self.weights),
            "weights_total": self.weights_total,
            "per_request": dict(self.per_request),
            "activations": self.activations,
            "graph_pools": self.graph_pools,
            "headroom": self.headroom,
            "prefix_cache": self.prefix_cache,
            "prefix_cache_shrunk": self.prefix_cache_shrunk,
            "host_experts": self.host_experts,
            "suggestions": list(self.suggestions),
        }


def plan_memory(
    config: CloverConfig,
    *,
    card_bytes: int,
    experts: ExpertFormat = "bf16",
    context_tokens: int | None = None,
    max_running: int | None = None,
    prefix_cache_bytes: int | None = None,
    int4_group: int = INT4_GROUP,
    fp8_block: tuple[int, int] = FP8_BLOCK,
    host_experts: bool = False,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    suggest: bool = True,
) -> MemoryPlan:
    """The memory plan of ``config`` on a card of ``card_bytes``.

    ``experts``: the routed experts' format as the loader would hold them (:func:`held_format`).
    ``context_tokens``: the longest conversation a request may reach (None: 32k, or the model's
    window if shorter). ``max_running``: requests decoded together (None: the most that fit).
    ``prefix_cache_bytes``: None gives the prefix cache's default or 5% of the card, the smaller.
    ``host_experts``: plan for the routed experts kept in host memory (the loader's
    ``experts_on="host"``: what the card then holds). ``prefill_chunk``: prompt tokens a request
    prefills per step (``BatchEngine``'s).
    ``suggest=False`` skips the search for what would fit.
    """
    if experts not in EXPERT_FORMATS:
        raise ValueError(f"unknown expert format {experts!r} (choose from {', '.join(EXPERT_FORMATS)})")
    context = context_tokens or min(DEFAULT_CONTEXT_TOKENS, config.max_position_embeddings)
    if context < 1 or (max_running is not None and max_running < 1):
        raise ValueError("context_tokens and max_running must be positive")
    if context > config.max_position_embeddings:
        raise ValueError(
            f"a context of {context:,} tokens is past the model's window of {config.max_position_embeddings:,}"
        )
    prefix = (
        min(DEFAULT_MAX_BYTES, int(PREFIX_CACHE_SHARE * card_bytes))
        if prefix_cache_bytes is None
        else prefix_cache_bytes
    )
    weights = weight_bytes(config, experts, int4_group=int4_group, fp8_block=fp8_block)
    if host_experts:
        weights["routed experts"] = 0
    per_request = request_bytes(config, context)

    def plan_for(running: int) -> MemoryPlan:
        step = activation_bytes(config, running * 2 * config.block_size)
        return MemoryPlan(
            card_bytes=card_bytes,
            experts=experts,
            context_tokens=context,
            weights=weights,
            per_request=per_request,
            max_running=running,
            activations=activation_bytes(config, forward_tokens(config, running, context, prefill_chunk)),
            graph_pools=step + GRAPH_POOL_FIXED_BYTES,  # the bucket's step intermediates live in the pool
            headroom=CUDA_CONTEXT_BYTES + int(FRAGMENTATION_SHARE * card_bytes),
            prefix_cache=prefix,
            host_experts=host_experts,
        )

    def shrunk(plan: MemoryPlan) -> MemoryPlan:
        """``plan`` with the prefix cache cut to what the card has left, if that makes it fit."""
        room = card_bytes - (plan.total_bytes - plan.prefix_cache)
        if plan.fits or plan.max_running < 1 or room < 0:
            return plan
        return replace(plan, prefix_cache=room, prefix_cache_shrunk=True)

    most = 0
    while most < MAX_PLANNED_REQUESTS and plan_for(most + 1).fits:
        most += 1
    # The prefix cache is elastic: it gives way to the requests asked for, or to a first request.
    plan = shrunk(plan_for(max_running if max_running is not None else max(most, 1)))
    if max_running is None and not plan.fits:
        plan = replace(plan, max_running=0)  # none fits; the parts still show one request's cost
    if not suggest or (plan.fits and max_running is None):
        return plan
    options = {
        "card_bytes": card_bytes,
        "prefix_cache_bytes": prefix_cache_bytes,
        "int4_group": int4_group,
        "fp8_block": fp8_block,
        "host_experts": host_experts,
        "prefill_chunk": prefill_chunk,
        "suggest": False,
    }
    return replace(plan, suggestions=_suggestions(config, plan, most, options))


def _suggestions(config: CloverConfig, plan: MemoryPlan, most: int, options: dict[str, Any]) -> list[str]:
    """What would fit when ``plan`` does not: the most requests, smaller expert formats, shorter
    contexts, routed experts in host memory."""
    context = plan.context_tokens
    out: list[str] = []
    if plan.fits:
        return out
    if most:
        out.append(f"fewer requests: {most} fit at {_tokens(context)}")
    smaller = EXPERT_FORMATS[EXPERT_FORMATS.index(plan.experts) + 1 :]
    for fmt in smaller:
        other = plan_memory(config, experts=fmt, context_tokens=context, **options)
        if other.fits:
            out.append(
                f"{fmt.upper()} experts (--experts {fmt}): fits with {other.max_running} request(s) at "
                f"{_tokens(context)}"
            )
    # A shorter context in this format; in the smallest one only when no format fits this context.
    for fmt in (plan.experts,) if out or not smaller else (plan.experts, smaller[-1]):
        shorter = _shorter_fit(config, fmt, context, options)
        if shorter is not None:
            label = "" if fmt == plan.experts else f"{fmt.upper()} experts (--experts {fmt}), "
            out.append(
                f"{label}context {_tokens(shorter.context_tokens)}: fits with {shorter.max_running} request(s)"
            )
            break
    if not out and not plan.host_experts:
        out.append(_host_experts(config, plan, options))
    return out


def _shorter_fit(
    config: CloverConfig, experts: ExpertFormat, context: int, options: dict[str, Any]
) -> MemoryPlan | None:
    """The longest halved context (down to 4k) at which ``experts`` fits at least one request."""
    shorter = context // 2
    while shorter >= 4096:
        plan = plan_memory(config, experts=experts, context_tokens=shorter, **options)
        if plan.fits:
            return plan
        shorter //= 2
    return None


def _host_experts(config: CloverConfig, plan: MemoryPlan, options: dict[str, Any]) -> str:
    """The routed experts kept in host memory (``--experts-on host``, computed by the CPU): what the
    card then holds, and what streaming them over PCIe instead (not built) would move per forward."""
    rest = plan_memory(
        config, experts=plan.experts, context_tokens=plan.context_tokens, **{**options, "host_experts": True}
    )
    host = weight_bytes(
        config, plan.experts, int4_group=options["int4_group"], fp8_block=options["fp8_block"]
    )
    one = host_expert_traffic(config, plan.experts, 1)
    block = host_expert_traffic(config, plan.experts, config.block_size)
    fits = f"{rest.max_running} request(s) at {_tokens(plan.context_tokens)}" if rest.fits else "nothing"
    return (
        f"routed experts in host memory (--experts-on host; docs/serving.md): "
        f"{_gib(host['routed experts'])} GiB of {plan.experts} experts in host RAM, then the card fits {fits}; "
        f"the CPU computes them, many times slower than the card (measured: bench/RESULTS.md); "
        f"streaming them over PCIe instead (not built) would move ~{one / 1e9:.2f} GB for one "
        f"token (at most {PCIE_BYTES_PER_S / one:.0f} forwards/s at {PCIE_BYTES_PER_S / 1e9:.0f} GB/s), "
        f"~{block / 1e9:.1f} GB for a {config.block_size}-token block "
        f"(at most {PCIE_BYTES_PER_S / block:.1f} forwards/s)"
    )


def held_format(stored_fp8: bool, experts: str = "auto") -> ExpertFormat:
    """The format the loader holds the routed experts in for a checkpoint (``stored_fp8``: its experts
    are FP8) and its ``experts=`` option (``load_model``): "auto" keeps an FP8 checkpoint FP8."""
    if experts == "auto":
        return "fp8" if stored_fp8 else "bf16"
    if experts == "dense":
        return "bf16"
    for known in EXPERT_FORMATS:
        if experts == known:
            return known
    raise ValueError(f"unknown experts choice {experts!r}")


def loaded_weight_bytes(model_dir: Path, experts: str = "auto", experts_on: str = "device") -> int:
    """The weights' bytes on the card once the checkpoint in ``model_dir`` is loaded with ``experts=``
    (:func:`held_format`) and ``experts_on=``: the files' size as stored for "auto" on the device,
    else the plan's count (an INT4 load of a bf16 checkpoint needs about a third of its files; with
    the routed experts in host memory, none of theirs). What readiness checks against the card
    (``check_engine(held=...)``). Raises ``CheckpointError`` for an unreadable checkpoint."""
    if experts == "auto" and experts_on == "device":
        return checkpoint_bytes(model_dir)
    config = CloverConfig.from_file(model_dir / "config.json")
    stored_fp8 = plan_load(read_tensor_index(model_dir)).fp8
    block = fp8_block_of(model_dir) if stored_fp8 else FP8_BLOCK
    parts = weight_bytes(config, held_format(stored_fp8, experts), fp8_block=block)
    if experts_on == "host":
        del parts["routed experts"]
    return sum(parts.values())


def checkpoint_plan(
    model_dir: Path | None,
    *,
    card_bytes: int,
    experts: str = "auto",
    context_tokens: int | None = None,
    max_running: int | None = None,
    experts_on: str = "device",
) -> MemoryPlan:
    """The plan of the checkpoint in ``model_dir`` (None: Clover-35B-A3B's published config), its
    routed experts held as the loader would hold them with ``experts=`` (``auto``: as stored) and
    ``experts_on=`` ("host": in host memory, not on the card), an FP8 checkpoint's scales at its own
    block size. Raises ``CheckpointError`` for an unreadable one."""
    if model_dir is None:
        config, stored_fp8, block = CloverConfig.from_dict(full_size_config_json()), False, FP8_BLOCK
    else:
        config = CloverConfig.from_file(model_dir / "config.json")
        stored_fp8 = plan_load(read_tensor_index(model_dir)).fp8
        block = fp8_block_of(model_dir) if stored_fp8 else FP8_BLOCK
    held = held_format(stored_fp8, experts)
    return plan_memory(
        config,
        card_bytes=card_bytes,
        experts=held,
        context_tokens=context_tokens,
        max_running=max_running,
        fp8_block=block,
        host_experts=experts_on == "host",
    )


def sizing_table(config: CloverConfig, cards_gib: tuple[int, ...], context_tokens: int) -> list[str]:
    """A Markdown table of every expert format on each card at ``context_tokens`` (docs/serving.md)."""
    out = [
        "| card | routed experts | weights | per request | requests that fit | prefix cache | total |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for card in cards_gib:
        for fmt in EXPERT_FORMATS:
            plan = plan_memory(config, card_bytes=card * GiB, experts=fmt, context_tokens=context_tokens)
            fits = str(plan.max_running) if plan.fits else "none"
            cache = f"{_gib(plan.prefix_cache)} GiB" + (" (shrunk)" if plan.prefix_cache_shrunk else "")
            out.append(
                f"| {card} GiB | {fmt} | {_gib(plan.weights_total)} GiB | {_gib(plan.request_total)} GiB | "
                f"{fits} | {cache} | {_gib(plan.total_bytes)} GiB |"
            )
    return out


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f}"


def _tokens(count: int) -> str:
    return f"{count // 1024}k" if count % 1024 == 0 else f"{count:,} tokens"
