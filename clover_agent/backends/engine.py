"""The ``engine`` backend: Clover decoded in this process by ``clover_agent.engine``.

The checkpoint is loaded once, on the first call, in a worker thread. Each call renders the
conversation with the checkpoint's own chat template (tools included), decodes with
``Engine.stream`` and parses the output with the Qwen3.6 protocol. While it decodes, the block
being denoised is streamed as ``BackendEvent(kind="block")`` and committed text as ``"reasoning"``
(before ``</think>``) then ``"text"``. Where it runs (a GPU with room for the weights; the CPU only
for checkpoints up to :data:`CPU_MAX_WEIGHT_BYTES`; otherwise the readiness report at once,
:func:`clover_agent.engine.loading.readiness.check_engine`) is in docs/backends.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from clover_agent.backends.base import (
    BackendEvent,
    BackendUnavailable,
    BlockView,
    ContextOverflow,
    EventCallback,
    ModelBackend,
    ModelTurn,
)
from clover_agent.backends.threads import BackendThreads, iterate_in_daemon_thread, run_in_daemon_thread
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.loading.locate import ModelSources
from clover_agent.engine.loading.readiness import (
    EXPERT_CHOICES,
    EXPERT_PLACES,
    EngineReadiness,
    GiB,
    check_engine,
)
from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.text.chat import render_chat
from clover_agent.engine.text.tokenizer import IM_START, load_tokenizer
from clover_agent.errors import UsageError
from clover_agent.protocol import THINK_OPEN, ThinkingSplitter

if TYPE_CHECKING:
    import torch

#: Largest checkpoint (bytes of weights) the engine backend runs on a CPU without being told to.
CPU_MAX_WEIGHT_BYTES = 2 * GiB
#: Tokens an answer may take when the caller sets no limit (reasoning included).
DEFAULT_MAX_NEW_TOKENS = 8192
#: How long :meth:`EngineBackend.close` waits for the engine's threads.
CLOSE_WAIT_S = 300.0

ZERO_WIDTH_SPACE = "\u200b"


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the template wants it: tool-call arguments as a dict, not a JSON string."""
    out = dict(message)
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            call = dict(call)
            function = dict(call.get("function", {}))
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"] or "{}")
            call["function"] = function
            calls.append(call)
        out["tool_calls"] = calls
    return out


def render_prompt(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template: str,
    *,
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for ``messages`` with the model's chat template: tools in the system turn,
    tool calls in the Qwen3.6 format, tool results as ``<tool_response>`` in a user turn."""
    return render_chat(
        template,
        [_template_message(m) for m in messages],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
    )


def _physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def engine_readiness(
    sources: ModelSources, experts: str = "auto", experts_on: str = "device"
) -> EngineReadiness:
    """Whether this machine can run the checkpoint in ``sources`` with its routed experts loaded as
    ``experts`` asks (the weights counted in that format; "auto": as stored) and where
    ``experts_on`` puts them ("host": only the weights that go to the card are counted)."""
    held = None
    if experts != "auto" or experts_on != "device":  # the plan's count (imports torch)
        from clover_agent.engine.memory_plan import loaded_weight_bytes

        held = functools.partial(loaded_weight_bytes, experts=experts, experts_on=experts_on)
    return check_engine(sources, held=held)


def _located(sources: ModelSources, experts: str = "auto", experts_on: str = "device") -> EngineReadiness:
    """The readiness report (the weights as ``experts`` and ``experts_on`` hold them), or
    :class:`BackendUnavailable` with it when no weights are found."""
    report = engine_readiness(sources, experts, experts_on)
    if report.model.path is None:
        raise BackendUnavailable(report.explain())
    return report


def serving_device(report: EngineReadiness) -> str | None:
    """The device this backend runs the checkpoint on when none is given ("cuda" or "cpu"), or
    None when this machine cannot serve it (see the module docstring for the rule)."""
    if report.ready:
        return "cuda"
    weights = report.weights_bytes or 0
    memory = _physical_memory_bytes()
    small = weights <= CPU_MAX_WEIGHT_BYTES and (memory == 0 or weights * 4 <= memory)
    if not report.gpu.available and small and report.model.path is not None:
        return "cpu"
    return None


def _device_for(report: EngineReadiness) -> str:
    device = serving_device(report)
    if device is None:
        raise BackendUnavailable(report.explain())
    return device


def choose_device(
    sources: ModelSources, experts: str = "auto", experts_on: str = "device"
) -> tuple[Path, str]:
    """The checkpoint folder and the device to run it on, or :class:`BackendUnavailable` with the
    readiness report when this machine cannot run it (the check ``fix`` makes before any work)."""
    report = _located(sources, experts, experts_on)
    return report.model.path, _device_for(report)  # type: ignore[return-value]  # located: not None


class EngineBackend(ModelBackend):
    """Clover in this process, from ``model_dir``, else the first checkpoint found in ``sources``.

    - ``sources``: from ``clover_agent.launch.model_sources`` (this backend reads no environment variable).
    - ``sampling``: a :class:`clover_agent.engine.decoding.sampling.SamplingParams` (default:
      ``SamplingParams.coding()`` with the checkpoint's block size and threshold).
    - ``max_new_tokens``: caps each answer; the context window caps it further.
    - ``cuda_graphs``: None (the default) replays the decoding steps as CUDA graphs on a CUDA device.
    - ``experts``: how the routed experts are held (``load_model``: "auto" as stored, "dense", or
      "fp8" / "int4" quantised while loading, which is what fits Clover on a 48 or 24 GB card).
    - ``experts_on``: where they are (``load_model``): "device", or "host": in host memory, computed
      by the CPU, which fits a 16 GB card at a large cost in speed (docs/serving.md).

    A prompt that leaves no room in the window raises :class:`ContextOverflow`. CUDA graphs are captured
    once per step shape and reused by every turn; loading prints how the steps run (and why eager, when
    they do).
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        kernels: str = "auto",
        cuda_graphs: bool | None = None,
        experts: str = "auto",
        experts_on: str = "device",
        sources: ModelSources | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        enable_thinking: bool = True,
        progress: TextIO | None = sys.stderr,
    ) -> None:
        if model_dir is not None or sources is None:
            sources = ModelSources(explicit=model_dir)
        if experts not in EXPERT_CHOICES:
            raise UsageError(f"unknown experts choice {experts!r} (choose from {', '.join(EXPERT_CHOICES)})")
        if experts_on not in EXPERT_PLACES:
            raise UsageError(
                f"unknown experts_on choice {experts_on!r} (choose from {', '.join(EXPERT_PLACES)})"
            )
        self.experts = experts
        self.experts_on = experts_on
        report = _located(sources, experts, experts_on)
        self.model_dir: Path = report.model.path  # type: ignore[assignment]  # located: not None
        self.device = device if device is not None else _device_for(report)
        self.dtype = dtype
        self.kernels = kernels
        self.cuda_graphs = cuda_graphs
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.enable_thinking = enable_thinking
        self.progress = progress
        tokenizer = load_tokenizer(self.model_dir)
        if tokenizer is None or tokenizer.chat_template is None:
            raise BackendUnavailable(
                f"The checkpoint at {self.model_dir} has no tokenizer.json or no chat template "
                "(chat_template.jinja or tokenizer_config.json); the agent needs both to write prompts."
            )
        self.tokenizer = tokenizer
        self.chat_template = tokenizer.chat_template
        # Every added token's text, special or not (a tool output's ``</tool_response>`` would close its
        # result and forge another, as ``<|im_end|>`` would a turn); longest first, so no token's text
        # is split by defusing a shorter one.
        self._special_texts = [text for text in tokenizer.marker_texts if text]
        self.name = f"engine:{self.model_dir.name}@{self.device}"
        self.config = CloverConfig.from_file(self.model_dir)
        self.context_window = self.config.max_position_embeddings
        self._engine: Any = None
        self._load_lock = asyncio.Lock()
        # (messages, tools, prompt text, its ids) of the last prompt rendered
        self._last_prompt: tuple[list[dict[str, Any]], list[dict[str, Any]], str, list[int]] | None = None
        self._turn_start = tokenizer.im_start_id
        self._threads = BackendThreads()  # loading and decoding: close() waits for them

    # -- loading -------------------------------------------------------------------------------------

    def load_now(self) -> Any:
        """Load the checkpoint (blocking; the first :meth:`complete` does it in a thread)."""
        if self._engine is not None:
            return self._engine
        import torch

        from clover_agent.engine.engine import Engine

        dtype = self.dtype
        if dtype is None:
            dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            engine = Engine.from_pretrained(
                self.model_dir,
                device=self.device,
                dtype=dtype,
                kernels=self.kernels,
                progress=self.progress,
                cuda_graphs=self.cuda_graphs,
                experts=self.experts,
                experts_on=self.experts_on,
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise BackendUnavailable(
                f"The engine cannot load the checkpoint at {self.model_dir}: {exc}"
            ) from exc
        self._engine = engine
        if self.progress is not None:
            print(f"engine: decoding steps: {engine.decoding_steps()}", file=self.progress, flush=True)
        return engine

    async def load(self) -> None:
        async with self._load_lock:
            if self._engine is None:
                await run_in_daemon_thread(self.load_now, name="clover-engine-load", threads=self._threads)

    # -- generation ----------------------------------------------------------------------------------

    def prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        enable_thinking: bool | None = None,
    ) -> str:
        """The prompt text, rendered with the checkpoint's own chat template (``enable_thinking``:
        None for this backend's setting; ``clover-agent serve`` sets it per request).

        Marker-token text anywhere in the messages or the tools (a file or a tool output holding
        ``<|im_end|>`` or ``</tool_response>``, copied into a call's arguments, a reasoning, a tool's
        description) gets a zero-width space after its first character, so it is read as text and
        can never end a turn or a tool result, nor forge one."""
        safe = [self._defused(message) for message in messages]
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return render_prompt(
            safe, self._defused(tools) if tools else tools, self.chat_template, enable_thinking=thinking
        )

    def _defused(self, value: Any) -> Any:
        """``value`` with every string in it (keys too) defused; unchanged values are returned as they are."""
        if isinstance(value, str):
            if "<" not in value or not any(s in value for s in self._special_texts):
                return value
            for special in self._special_texts:
                value = value.replace(special, special[0] + ZERO_WIDTH_SPACE + special[1:])
            return value
        if isinstance(value, Mapping):
            pairs = [(self._defused(k), self._defused(v)) for k, v in value.items()]
            if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
                return value
            return dict(pairs)
        if isinstance(value, list | tuple):
            items = [self._defused(item) for item in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt's token ids. The last rendering is kept: the agent counts the prompt, then
        asks for the turn of the same conversation, and that renders and tokenises it once. The
        next step's prompt extends the last one (the template re-renders the history the same), so
        only what follows their common part is tokenised: :meth:`_incremental_ids`."""
        last = self._last_prompt
        if last is not None and last[1] is tools and last[0] == messages:
            return last[3]
        text = self.prompt(messages, tools)
        ids = self._incremental_ids(text)
        self._last_prompt = ([dict(m) for m in messages], tools, text, ids)
        return ids

    def _incremental_ids(self, text: str) -> list[int]:
        """The ids of ``text``, reusing the last prompt's up to its last turn start: text before a
        special token is tokenised on its own (the tokenizer splits at special tokens first), so
        ``encode(a + b) == encode(a) + encode(b)`` when ``b`` starts with ``<|im_start|>``. A
        template that re-renders earlier turns differently (it drops old reasoning) makes the texts
        part earlier: then the whole text is tokenised."""
        last = self._last_prompt
        start = self._turn_start
        if last is not None and start is not None:
            previous_text, previous_ids = last[2], last[3]
            cut = previous_text.rfind(IM_START)
            index = len(previous_ids) - 1 - previous_ids[::-1].index(start) if start in previous_ids else -1
            if cut > 0 and index >= 0 and text.startswith(previous_text[: cut + len(IM_START)]):
                return previous_ids[:index] + self.tokenizer.encode(text[cut:])
        return self.tokenizer.encode(text)

    def count_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return len(self.prompt_ids(messages, tools))

    def _params(self, prompt_length: int) -> SamplingParams:
        room = self.context_window - prompt_length
        if room <= 0:
            raise ContextOverflow(prompt_length, self.context_window)
        base = self.sampling if self.sampling is not None else SamplingParams.coding(self.config)
        return base.with_changes(max_new_tokens=min(self.max_new_tokens, room), thinking=self.enable_thinking)

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_event: EventCallback | None = None,
    ) -> ModelTurn:
        await self.load()
        engine = self._engine
        prompt_ids = self.prompt_ids(messages, tools)
        params = self._params(len(prompt_ids))
        from clover_agent.engine.decoding.stream import BlockCommitted, BlockProgress, GenerationDone

        splitter = ThinkingSplitter(self.enable_thinking)
        result = None
        previous: BlockProgress | None = None  # the last pass's state, to tell what this one decided
        events = iterate_in_daemon_thread(
            lambda: engine.stream(prompt_ids, params), name="clover-engine-decode", threads=self._threads
        )
        async with aclosing(events):
            async for event in events:
                if isinstance(event, GenerationDone):
                    result = event.result
                elif on_event is None:
                    continue
                elif isinstance(event, BlockProgress):
                    on_event(_block_event(self.tokenizer, event, previous))
                    previous = event
                elif isinstance(event, BlockCommitted):
                    text = event.text if event.text is not None else self.tokenizer.decode(event.token_ids)
                    for kind, piece in splitter.feed(text):
                        on_event(BackendEvent(kind=kind, text=piece))
        if result is None:
            raise BackendUnavailable("The engine stopped without finishing the answer.")
        if on_event is not None:
            for kind, piece in splitter.flush():
                on_event(BackendEvent(kind=kind, text=piece))
        text = self.tokenizer.decode(result.token_ids)
        # The prompt opened <think>; put it back so the raw text stands alone (replay files, trajectories).
        raw = f"{THINK_OPEN}\n{text}" if self.enable_thinking else text
        return ModelTurn.from_text(
            raw,
            tools,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(result.token_ids),
            # "length" and "loop" both mean the answer was cut, not finished
            finish_reason=None if result.finish_reason == "stop" else "length",
            forwards=result.forwards,
        )

    async def close(self) -> None:
        """Wait for a stopped decode (it ends after its current pass) or a load still running: a
        thread inside torch when the interpreter exits aborts the process. A load cannot be cut
        short; past :data:`CLOSE_WAIT_S` the process goes on (and says so)."""
        left = await self._threads.wait(CLOSE_WAIT_S)
        if left:
            print(
                f"clover-agent: the engine's {', '.join(t.name for t in left)} thread did not stop within "
                f"{CLOSE_WAIT_S:.0f} s",
                file=sys.stderr,
            )
        self._engine = None


def _block_event(tokenizer: Any, event: Any, previous: Any) -> BackendEvent:
    """A provisional block for a live view: its tokens, which are decided (and which just now), and
    the decided text. ``previous`` is the pass before, if any (another block's does not count)."""
    before = previous.filled if previous is not None and previous.block == event.block else None
    if before is not None and len(before) != len(event.filled):
        before = None  # a speculative draft of another length over the same block
    newly = [i for i, filled in enumerate(event.filled) if filled and not (before and before[i])]
    decided = [t for t, filled in zip(event.token_ids, event.filled, strict=True) if filled]
    return BackendEvent(
        kind="block",
        block=BlockView(
            block=event.block,
            position=event.position,
            denoise_step=event.step,
            token_ids=list(event.token_ids),
            filled=list(event.filled),
            newly_filled=newly,
            text=tokenizer.decode(decided),
        ),
    )
