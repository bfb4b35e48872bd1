"""The memory plan (engine/memory_plan.py) against Clover's real config on 80, 24 and 16 GiB cards,
and its weight arithmetic against the bytes real models hold: the full-size model on the meta
device part by part, and tiny checkpoints loaded with dense, FP8 and INT4 experts."""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from clover_agent.engine.loading.locate import ModelSources
from clover_agent.engine.loading.readiness import (
    HEADROOM_BYTES,
    GpuInfo,
    check_engine,
    checkpoint_bytes,
)
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.loading.weights import load_model
from clover_agent.engine.memory_plan import (
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION_SHARE,
    ExpertFormat,
    GiB,
    checkpoint_plan,
    held_format,
    host_expert_traffic,
    loaded_weight_bytes,
    plan_memory,
    request_bytes,
    routed_expert_bytes,
    sizing_table,
    weight_bytes,
)
from clover_agent.engine.model.cache import ModelCache
from clover_agent.engine.model.config import CloverConfig, full_size_config_json
from clover_agent.engine.model.network import CloverModel

REPO = Path(__file__).resolve().parents[2]
CONFIG = CloverConfig.from_dict(full_size_config_json())
TEXT = full_size_config_json()["text_config"]
#: Where each parameter of CloverModel belongs in the plan (first match wins).
PARTS = (
    (r"^embed_tokens\.", "embedding"),
    (r"^lm_head\.", "LM head"),
    (r"\.self_attn\.", "attention"),
    (r"\.linear_attn\.", "gated deltanet"),
    (r"norm\.weight$", "norms"),
    (r"\.mlp\.(gate|shared_expert_gate)\.", "router"),
    (r"\.mlp\.shared_expert\.", "shared experts"),
    (r"\.mlp\.experts\.", "routed experts"),
)


def part_of(name: str) -> str:
    return next(part for pattern, part in PARTS if re.search(pattern, name))


def model_bytes_by_part(model: torch.nn.Module) -> dict[str, int]:
    """Bytes the model really holds, by part: every storage behind its parameters and buffers
    counted once (fused projections are views of one matrix)."""
    seen: set[int] = set()
    out: dict[str, int] = defaultdict(int)
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    for name, tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        out[part_of(name)] += storage.nbytes()
    return dict(out)


def test_weight_parts_equal_the_full_size_model_part_by_part() -> None:
    with torch.device("meta"):
        model = CloverModel(CONFIG, kernels="torch").to(torch.bfloat16)
    expected: dict[str, int] = defaultdict(int)
    for name, param in model.named_parameters():
        expected[part_of(name)] += param.numel() * 2
    planned = {k: v for k, v in weight_bytes(CONFIG, "bf16").items() if v}
    assert planned == dict(expected)
    # The published checkpoint is about 69 GB in bf16.
    assert sum(planned.values()) == pytest.approx(69e9, rel=0.02)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Odd sizes on purpose: an expert width that is a multiple of neither the INT4 group nor the
    FP8 block (each of gate and up has its own partial block of scales)."""
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("memplan") / "ckpt",
        tokenizer=False,
        bidirectional=True,
        layout="per-expert",
        dtype=torch.bfloat16,
        overrides={"moe_intermediate_size": 40},
    )


@pytest.mark.parametrize(("experts", "loader"), [("bf16", "dense"), ("fp8", "fp8"), ("int4", "int4")])
def test_weight_parts_equal_a_loaded_tiny_model(tiny: Path, experts: ExpertFormat, loader: str) -> None:
    """Tolerance: none; every part's bytes are equal to what the loader allocated."""
    model, config = load_model(tiny, dtype=torch.bfloat16, progress=None, experts=loader, int4_group=16)
    planned = {k: v for k, v in weight_bytes(config, experts, int4_group=16).items() if v}
    assert planned == model_bytes_by_part(model)


@pytest.mark.parametrize("experts", ["dense", "fp8", "int4"])
def test_readiness_counts_the_weights_as_the_loader_holds_them(tiny: Path, experts: str) -> None:
    """What ``doctor``, ``fix`` and ``serve`` check against the card before loading (``check_engine(held=)``)
    equals what the loader allocates with that ``experts`` choice; "auto" is the files' size."""
    model, _ = load_model(tiny, dtype=torch.bfloat16, progress=None, experts=experts)
    assert loaded_weight_bytes(tiny, experts) == sum(model_bytes_by_part(model).values())
    assert loaded_weight_bytes(tiny) == checkpoint_bytes(tiny)


def test_a_card_too_small_for_dense_experts_is_ready_for_int4(tiny: Path) -> None:
    """A card between the two needs: the dense load is refused with what it needs, the INT4 one is
    ready (the check a 24 GB card gets for bf16 Clover against ``--experts int4``)."""
    dense, int4 = loaded_weight_bytes(tiny, "dense"), loaded_weight_bytes(tiny, "int4")
    assert int4 < dense
    card = GpuInfo(
        available=True, name="a card between them", total_bytes=HEADROOM_BYTES + (dense + int4) // 2
    )
    sources = ModelSources(explicit=tiny)
    refused = check_engine(sources, held=functools.partial(loaded_weight_bytes, experts="dense"), gpu=card)
    assert not refused.ready and refused.problems[0].startswith("GPU a card between them has")
    ready = check_engine(sources, held=functools.partial(loaded_weight_bytes, experts="int4"), gpu=card)
    assert ready.ready and ready.weights_bytes == int4


@pytest.mark.parametrize(("experts", "held"), [("auto", "bf16"), ("dense", "bf16"), ("int4", "int4")])
def test_readiness_counts_only_what_goes_to_the_card_with_the_experts_on_the_host(
    tiny: Path, experts: str, held: ExpertFormat
) -> None:
    """``experts_on="host"``: the count checked against the card equals every weight the loader
    allocates except the routed experts, which are exactly the plan's host part; a card too small
    for the whole model but big enough for the rest is ready."""
    model, config = load_model(tiny, dtype=torch.bfloat16, progress=None, experts=experts, experts_on="host")
    parts = model_bytes_by_part(model)
    host = parts.pop("routed experts")
    assert host == weight_bytes(config, held)["routed experts"] > 0
    on_card = loaded_weight_bytes(tiny, experts, experts_on="host")
    assert on_card == sum(parts.values())
    assert on_card + host == loaded_weight_bytes(tiny, "dense" if experts == "auto" else experts)
    card = GpuInfo(available=True, name="a small card", total_bytes=HEADROOM_BYTES + on_card + host // 2)
    sources = ModelSources(explicit=tiny)
    whole = functools.partial(loaded_weight_bytes, experts=experts)
    assert not check_engine(sources, held=whole, gpu=card).ready
    rest = functools.partial(loaded_weight_bytes, experts=experts, experts_on="host")
    report = check_engine(sources, held=rest, gpu=card)
    assert report.ready and report.weights_bytes == on_card
    plan = checkpoint_plan(tiny, card_bytes=4 * GiB, experts=experts, experts_on="host")
    assert plan.host_experts and plan.weights["routed experts"] == 0
    assert plan.weights_total == on_card


def test_fp8_checkpoint_planned_as_the_loader_holds_it(tiny: Path, tmp_path: Path) -> None:
    """``experts="auto"`` on an FP8 checkpoint (16 x 16 block scales, as its config says): the plan's
    parts equal what the loader keeps, its own scales included."""
    from safetensors.torch import load_file, save_file

    from clover_agent.kernels.moe.quant import quantize_fp8

    out = tmp_path / "fp8"
    out.mkdir()
    tensors = load_file(str(tiny / "model.safetensors"))
    for name in [n for n in tensors if ".mlp.experts." in n]:
        tensors[name], tensors[name + "_scale_inv"] = quantize_fp8(tensors[name], (16, 16))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tiny / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [16, 16]}
    (out / "config.json").write_text(json.dumps(config))
    plan = checkpoint_plan(out, card_bytes=4 * GiB)
    assert plan.experts == "fp8"
    model, _ = load_model(out, dtype=torch.bfloat16, progress=None)
    assert {k: v for k, v in plan.weights.items() if v} == model_bytes_by_part(model)
    assert checkpoint_plan(out, card_bytes=4 * GiB, experts="bf16").experts == "bf16"


def test_request_state_equals_the_model_cache_at_full_size() -> None:
    """K/V and GDN state of one request: the bytes ``ModelCache`` allocates (on the meta device)
    for the context plus the two blocks a step writes past it."""
    context = 32768
    cache = ModelCache.empty(CONFIG, "meta", torch.bfloat16, capacity=context + 2 * CONFIG.block_size)
    state = request_bytes(CONFIG, context)
    assert state["attention K/V"] + state["GDN state"] == cache.nbytes()


def test_request_state_and_concurrency_on_80_gib_follow_the_arithmetic() -> None:
    card, context = 80 * GiB, 16384
    plan = plan_memory(CONFIG, card_bytes=card, experts="bf16", context_tokens=context)
    full = TEXT["layer_types"].count("full_attention")
    linear = TEXT["layer_types"].count("linear_attention")
    kv_per_token = 2 * full * TEXT["num_key_value_heads"] * TEXT["head_dim"] * 2
    assert kv_per_token == 20480
    block = full_size_config_json()["block_size"]
    conv_channels = 2 * TEXT["linear_num_key_heads"] * TEXT["linear_key_head_dim"] + (
        TEXT["linear_num_value_heads"] * TEXT["linear_value_head_dim"]
    )
    gdn = linear * (
        TEXT["linear_num_value_heads"] * TEXT["linear_key_head_dim"] * TEXT["linear_value_head_dim"] * 4
        + conv_channels * (TEXT["linear_conv_kernel_dim"] - 1) * 2
    )
    workspace = 2 * block * TEXT["vocab_size"] * 4
    per_request = kv_per_token * (context + 2 * block) + gdn + workspace
    assert plan.request_total == per_request

    # The chosen count is the most whose sum fits: N fits, N + 1 does not (activations and graph
    # pools are the plan's stated allowances at each count).
    headroom = CUDA_CONTEXT_BYTES + int(FRAGMENTATION_SHARE * card)
    prefix = 4 * GiB
    weights = sum(weight_bytes(CONFIG, "bf16").values())

    def total(n: int) -> int:
        at = plan_memory(CONFIG, card_bytes=card, context_tokens=context, max_running=n, suggest=False)
        return weights + n * per_request + at.activations + at.graph_pools + headroom + prefix

    n = plan.max_running
    assert plan.fits and n >= 1 and not plan.prefix_cache_shrunk
    assert total(n) == plan.total_bytes <= card < total(n + 1)
    free = card - weights - headroom - prefix - plan.activations - plan.graph_pools
    assert n == free // per_request  # the allowances grow by far less than a request per request


def test_bf16_does_not_fit_24_gib_and_names_int4() -> None:
    plan = plan_memory(CONFIG, card_bytes=24 * GiB, experts="bf16")
    assert not plan.fits and plan.max_running == 0
    assert any(s.startswith("INT4 experts (--experts int4): fits with") for s in plan.suggestions)
    # FP8 experts (about 35 GiB of weights) cannot fit a 24 GiB card: not offered there.
    assert not any(s.startswith("FP8") for s in plan.suggestions)
    wider = plan_memory(CONFIG, card_bytes=48 * GiB, experts="bf16")
    assert not wider.fits
    assert [s.split(":")[0] for s in wider.suggestions[:2]] == [
        "FP8 experts (--experts fp8)",
        "INT4 experts (--experts int4)",
    ]


def test_fp8_fits_80_gib_with_many_requests() -> None:
    plan = plan_memory(CONFIG, card_bytes=80 * GiB, experts="fp8", context_tokens=32768)
    assert plan.fits and plan.max_running >= 32 and plan.suggestions == []
    assert plan.total_bytes <= 80 * GiB


def test_int4_fits_24_gib() -> None:
    """One request at 32k, with the prefix cache shrunk to what is left (its 1.2 GiB budget does
    not leave room for one); asked for more at 8k, they fit in the cache's place."""
    at_32k = plan_memory(CONFIG, card_bytes=24 * GiB, experts="int4", context_tokens=32768)
    assert at_32k.fits and at_32k.max_running == 1 and at_32k.prefix_cache_shrunk
    assert 0 < at_32k.prefix_cache < at_32k.request_total
    at_8k = plan_memory(CONFIG, card_bytes=24 * GiB, experts="int4", context_tokens=8192, max_running=2)
    assert at_8k.fits and at_8k.prefix_cache_shrunk
    assert at_8k.total_bytes <= 24 * GiB


def test_16_gib_names_host_memory_experts_and_their_pcie_cost() -> None:
    plan = plan_memory(CONFIG, card_bytes=16 * GiB, experts="int4")
    assert not plan.fits
    [host] = plan.suggestions
    assert host.startswith("routed experts in host memory (--experts-on host; docs/serving.md)")
    assert "planned, not built" not in host and "streaming them over PCIe instead (not built)" in host
    one_token = 40 * 8 * routed_expert_bytes(CONFIG, "int4")  # layers x top-k x one expert
    assert host_expert_traffic(CONFIG, "int4", 1) == one_token
    assert f"~{one_token / 1e9:.2f} GB for one token" in host
    rest = plan_memory(CONFIG, card_bytes=16 * GiB, experts="int4", host_experts=True)
    assert rest.fits and rest.weights["routed experts"] == 0
    assert f"the card fits {rest.max_running} request(s) at 32k" in host
    # Planned with the experts in host memory already, a card too small for the rest is offered
    # nothing it already has.
    small = plan_memory(CONFIG, card_bytes=4 * GiB, experts="int4", host_experts=True)
    assert not small.fits and not any("host memory" in s for s in small.suggestions)


def test_too_many_requests_asked_names_the_most_that_fit() -> None:
    chosen = plan_memory(CONFIG, card_bytes=80 * GiB, experts="fp8", context_tokens=32768)
    asked = plan_memory(
        CONFIG, card_bytes=80 * GiB, experts="fp8", context_tokens=32768, max_running=chosen.max_running + 8
    )
    assert not asked.fits and asked.max_running == chosen.max_running + 8
    assert f"fewer requests: {chosen.max_running} fit at 32k" in asked.suggestions


def test_lines_and_dict() -> None:
    plan = plan_memory(CONFIG, card_bytes=80 * GiB, experts="int4", context_tokens=16384)
    text = "\n".join(plan.lines())
    assert "routed experts int4" in text and f"fits: {plan.max_running} request(s) at 16,384 tokens" in text
    assert f"{plan.total_bytes / GiB:.2f} GiB of 80.00" in text
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["fits"] is True and data["max_running"] == plan.max_running
    assert data["total_bytes"] == plan.total_bytes and data["weights"] == plan.weights


def test_held_format_follows_the_loader() -> None:
    assert held_format(stored_fp8=True) == "fp8" and held_format(stored_fp8=False) == "bf16"
    assert held_format(True, "dense") == "bf16" and held_format(False, "int4") == "int4"
    with pytest.raises(ValueError, match="unknown experts choice"):
        held_format(False, "int3")


def test_the_docs_show_what_the_code_plans() -> None:
    """docs/serving.md's table and its 16 GiB example are the ones the code produces."""
    doc = (REPO / "docs" / "serving.md").read_text()
    assert "\n".join(sizing_table(CONFIG, (80, 24, 16), 32768)) in doc
    assert "\n".join(plan_memory(CONFIG, card_bytes=16 * GiB, experts="int4").lines()) in doc
    assert "FP8 experts (about 35 GiB of weights) need a 39 GiB card" in doc
    assert plan_memory(CONFIG, card_bytes=39 * GiB, experts="fp8").fits
    assert not plan_memory(CONFIG, card_bytes=38 * GiB, experts="fp8").fits
