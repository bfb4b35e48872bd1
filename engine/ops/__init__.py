"""The model's heavy operators and the per-operator kernel contract.

Every operator the model spends its time in is one function of a fixed signature (:class:`Ops`),
implemented by backends: ``"torch"`` (plain PyTorch: the references of ``clover_agent.kernels``
where one has the engine's signature, else ``torch_ops.py``) and ``"triton"`` (the kernels of
``clover_agent.kernels``, adapted in ``triton_ops.py`` where the signature differs). Both are
imported when first resolved, so importing the engine imports neither triton nor the kernels.
:func:`resolve_ops` picks a backend per operator; the choices are in docs/decoding.md ("How a
forward runs").
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from clover_agent.engine.errors import EngineArgumentError

KERNEL_CHOICES: tuple[str, ...] = ("auto", "torch", "triton")
KernelChoice = str | Mapping[str, str]

#: Operator -> backend -> "module:function", imported when first resolved.
PROVIDERS: dict[str, dict[str, str]] = {
    "rms_norm": {
        "torch": "clover_agent.kernels.norms.reference:rms_norm",
        "triton": "clover_agent.kernels.norms:rms_norm",
    },
    "rms_norm_rotary": {
        "torch": "clover_agent.kernels.norms.reference:rms_norm_rotary",
        "triton": "clover_agent.kernels.norms:rms_norm_rotary",
    },
    "add_rms_norm": {
        "torch": "clover_agent.kernels.norms.reference:add_rms_norm",
        "triton": "clover_agent.kernels.norms:add_rms_norm",
    },
    "gdn_gates": {
        "torch": "clover_agent.kernels.gated_delta_rule.reference:gdn_gates",
        "triton": "clover_agent.kernels.gated_delta_rule:gdn_gates",
    },
    "short_conv": {
        "torch": "clover_agent.kernels.short_conv.reference:short_conv",
        "triton": "clover_agent.kernels.short_conv:short_conv",
    },
    "gated_delta_net": {
        "torch": "clover_agent.kernels.gated_delta_rule.reference:gated_delta_net",
        "triton": "clover_agent.kernels.gated_delta_rule:gated_delta_net",
    },
    "attention": {
        "torch": "clover_agent.engine.ops.torch_ops:attention",
        "triton": "clover_agent.engine.ops.triton_ops:attention",
    },
    "sparse_moe": {
        "torch": "clover_agent.engine.ops.torch_ops:sparse_moe",
        "triton": "clover_agent.kernels.moe:sparse_moe",
    },
}
OP_NAMES: tuple[str, ...] = tuple(PROVIDERS)
#: Implementations registered in code (another backend of an operator, e.g. in a test).
_REGISTERED: dict[str, dict[str, Callable]] = {}


def register(op: str, backend: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` the ``op`` operator of ``backend``."""
    if op not in OP_NAMES:
        raise ValueError(f"unknown operator {op!r} (known: {', '.join(OP_NAMES)})")

    def add(fn: Callable) -> Callable:
        _REGISTERED.setdefault(op, {})[backend] = fn
        return fn

    return add


@dataclass(frozen=True)
class Ops:
    """One implementation of every operator; ``backends`` says which backend each came from.

    The operators (T tokens, H heads, D head size, C channels, E experts):

    * ``rms_norm(x, weight, eps)``: zero-centred RMSNorm;
    * ``rms_norm_rotary(x, weight, eps, cos, sin)``: an attention head's q or k norm, then its
      (partial) rotary embedding;
    * ``add_rms_norm(x, delta, weight, eps)``: the residual add and the next RMSNorm, ``(x + delta,
      rms_norm(x + delta))``;
    * ``gdn_gates(a, b, a_log, dt_bias)``: a GDN layer's per-head log decay (float32) and write
      strength from its ``a`` and ``b`` projections;
    * ``short_conv(rows, weight, state, right_weight, block_size, activation)``: the GDN causal
      conv from the (read-only) conv state, plus Clover's block-local right conv, plus SiLU;
    * ``gated_delta_net(q, k, v, g, beta, state, scale, z, norm_weight, eps, *, commit,
      block_size, mix_logits, normalize_qk)``: the GDN core (forward scan from the read-only
      committed state, the state after ``commit`` tokens, the in-block backward branch and mix,
      the gated norm);
    * ``attention(q, key_buffer, value_buffer, past, block_size, block_from, scale, gate)``: gated
      attention over the cache (``torch_ops.attention``);
    * ``sparse_moe(x, router_logits, top_k, gate_up_proj, down_proj, *, shared,
      shared_gate_logits, residual)``: routing, routed experts and the combine with the gated
      shared expert and residual; the expert weights may be tensors or quantised
      (``kernels.moe.quant.QuantizedWeight``, docs/quantization.md).
    """

    rms_norm: Callable[..., torch.Tensor]
    rms_norm_rotary: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    gdn_gates: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    short_conv: Callable[..., torch.Tensor]
    gated_delta_net: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    attention: Callable[..., torch.Tensor]
    sparse_moe: Callable[..., torch.Tensor]
    backends: dict[str, str] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        """The one backend every operator came from, or ``"mixed"``."""
        names = set(self.backends.values())
        return names.pop() if len(names) == 1 else "mixed"


def triton_unusable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None when they can)."""
    if device.type not in ("cpu", "cuda"):
        return f"Triton does not run on {device.type} devices"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton runs on the CPU only under TRITON_INTERPRET=1"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is visible"
    from clover_agent.kernels.runtime import triton_problem

    return triton_problem()


def load(op: str, backend: str) -> Callable:
    """The ``backend`` implementation of ``op`` (raises ImportError/AttributeError when it cannot load)."""
    registered = _REGISTERED.get(op, {}).get(backend)
    if registered is not None:
        return registered
    module, name = PROVIDERS[op][backend].split(":")
    return getattr(importlib.import_module(module), name)


def _implementation(op: str, backend: str, device: torch.device) -> tuple[Callable | None, str]:
    """(implementation, why not) of ``op`` in ``backend`` on ``device``."""
    if backend not in PROVIDERS[op] and backend not in _REGISTERED.get(op, {}):
        return None, f"no {backend} implementation"
    if backend == "triton":
        reason = triton_unusable(device)
        if reason:
            return None, reason
    try:
        return load(op, backend), ""
    except (ImportError, AttributeError) as exc:
        return None, f"{PROVIDERS[op].get(backend, backend)} cannot be loaded ({exc})"


def _choices(kernels: KernelChoice) -> dict[str, str]:
    if isinstance(kernels, str):
        if kernels not in KERNEL_CHOICES:
            raise EngineArgumentError(
                f"unknown kernels choice {kernels!r} (choose from {', '.join(KERNEL_CHOICES)})"
            )
        return dict.fromkeys(OP_NAMES, kernels)
    unknown = sorted(set(kernels) - set(OP_NAMES))
    if unknown:
        raise EngineArgumentError(
            f"kernels: unknown operator(s) {', '.join(unknown)} (known: {', '.join(OP_NAMES)})"
        )
    return {op: kernels.get(op, "auto") for op in OP_NAMES}


def check_kernels(kernels: KernelChoice) -> None:
    """Raise an EngineArgumentError now for a choice :func:`resolve_ops` could never accept."""
    _choices(kernels)


def resolve_ops(kernels: KernelChoice = "auto", device: torch.device | str = "cpu") -> Ops:
    """The operator table for ``kernels`` on ``device``, resolved operator by operator.

    * ``"torch"``: every operator from PyTorch;
    * ``"auto"``: per operator, Triton on a CUDA device when it is importable and implements that
      operator, PyTorch otherwise (so one missing or broken kernel falls back alone);
    * ``"triton"``: Triton for every operator, also on the CPU under ``TRITON_INTERPRET=1`` (set
      before triton is imported); an operator without a usable Triton version is an error naming it;
    * a mapping ``{"attention": "triton", ...}``: those operators from that backend, the rest ``auto``.
    """
    device = torch.device(device)
    chosen: dict[str, Callable] = {}
    backends: dict[str, str] = {}
    missing: list[str] = []
    for op, choice in _choices(kernels).items():
        if choice == "auto":
            fn, _ = _implementation(op, "triton", device) if device.type == "cuda" else (None, "")
            backend = "triton" if fn is not None else "torch"
            fn = fn or load(op, "torch")
        else:
            fn, why = _implementation(op, choice, device)
            backend = choice
            if fn is None:
                missing.append(f"{op} ({why})")
                continue
        chosen[op], backends[op] = fn, backend
    if missing:
        raise EngineArgumentError(
            f"kernels={kernels!r} on {device.type}: no usable implementation of {'; '.join(missing)}. "
            "Use kernels='auto' (the fastest available per operator) or 'torch'"
        )
    return Ops(**chosen, backends=backends)
