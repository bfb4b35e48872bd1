"""The loop with the in-process engine on a tiny random checkpoint: a bounded number of steps.

The model's text is noise (random weights); what is checked is the machinery: the prompt is the
checkpoint's chat template rendering of the loop's conversation, provisional blocks and text stream
as events, and turns without a usable tool call are fed back to the model instead of breaking the run.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from clover_agent.agent import Agent, Budget, TrajectoryWriter, load_trajectory
from clover_agent.agent.condenser import Condenser
from clover_agent.agent.loop import RunResult
from clover_agent.agent.notes import INTERRUPTED_REPLY
from clover_agent.agent.trajectory import ResumeState, read_events
from clover_agent.backends.engine import EngineBackend
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.decoding.stream import GenerationDone
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.text.chat import bundled_chat_template
from clover_agent.errors import ExitCode
from clover_agent.events import (
    CallInterrupted,
    ContextCondensed,
    ErrorReported,
    Event,
    EventBus,
    ModelDelta,
    ModelResponded,
    PromptRefused,
    ProvisionalBlock,
)
from clover_agent.fix.progress import RunFigures
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.shell import ShellTool
from tests.sandbox_specs import sandbox_spec

TEMPLATE_MARK = "[tiny-checkpoint-template]"
STEPS = 3


@pytest.mark.slow
async def test_engine_drives_a_bounded_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_tiny_checkpoint(tmp_path / "ckpt", peaked=True, seed=5)
    (model / "chat_template.jinja").write_text(TEMPLATE_MARK + bundled_chat_template(), encoding="utf-8")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("A = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)

    backend = EngineBackend(
        model, device="cpu", sampling=SamplingParams.greedy(), max_new_tokens=40, progress=None
    )
    engine = backend.load_now()
    decoded: list[tuple[int, int]] = []  # (prompt tokens, tokens whose state came from the prefix cache)
    real_stream = engine.stream

    def recording_stream(prompt_ids, params):
        for event in real_stream(prompt_ids, params):
            if isinstance(event, GenerationDone):
                decoded.append((len(prompt_ids), event.result.reused_tokens))
            yield event

    monkeypatch.setattr(engine, "stream", recording_stream)
    bus = EventBus()
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl", keep_stream=True)  # the stream is looked at
    bus.subscribe(writer)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        agent = Agent(backend, sandbox, bus, run_id="engine", budget=Budget(max_steps=STEPS, max_time_s=600))
        result = await agent.run("Change A to 2 in /workspace/a.py.", "You are a test agent.")
    await backend.close()
    writer.close()

    assert result.exit_code in (ExitCode.BUDGET_EXHAUSTED, ExitCode.AGENT_ERROR, ExitCode.OK), result.message
    events = read_events(tmp_path / "trajectory.jsonl")
    turns = [e for e in events if isinstance(e, ModelResponded)]
    assert 1 <= len(turns) <= STEPS
    assert any(isinstance(e, ProvisionalBlock) for e in events)
    assert any(isinstance(e, ModelDelta) for e in events)
    assert all(0 < t.completion_tokens <= 40 for t in turns)
    # Each turn re-sends the growing conversation; the engine continues from the previous prompt's
    # committed blocks instead of recomputing them (the prefix cache, end to end).
    assert len(decoded) == len(turns) >= 2 and decoded[0][1] == 0
    for (previous, _), (_, reused) in itertools.pairwise(decoded):
        assert reused >= previous // 32 * 32

    # The first prompt is the checkpoint's template rendering of the loop's first two messages.
    state = load_trajectory(tmp_path / "trajectory.jsonl")
    first_prompt = backend.prompt(state.messages[:2], agent.tool_specs)
    assert first_prompt.startswith(TEMPLATE_MARK) and "You are a test agent." in first_prompt
    assert turns[0].prompt_tokens == backend.count_tokens(state.messages[:2], agent.tool_specs)

    # Noise is not a tool call: each such turn is answered with a message to the model, no crash.
    for i, event in enumerate(events):
        if isinstance(event, ModelResponded) and not event.tool_calls:
            added, error, feedback = events[i + 1 : i + 4]
            assert added.message["role"] == "assistant" and added.message["content"] == event.content
            assert isinstance(error, ErrorReported) and error.kind == "format"
            assert feedback.message == {"role": "user", "content": error.message}


class BareShell(ShellTool):
    """The shell with a short spec, so prompts fit the tiny window below."""

    description = "Run a command."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    }


SHELL_TOOL = BareShell().spec()
WINDOW = 1024  # a tiny context window, so a long prompt is cheap to build and to decode


@pytest.fixture(scope="module")
def small_window_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("window") / "ckpt",
        peaked=True,
        seed=5,
        overrides={"max_position_embeddings": WINDOW},
    )


async def run_agent(
    model: Path, repo: Path, task: str, resume: ResumeState | None = None
) -> tuple[RunResult, list[Event]]:
    backend = EngineBackend(
        model, device="cpu", sampling=SamplingParams.greedy(), max_new_tokens=16, progress=None
    )
    assert backend.context_window == WINDOW
    bus = EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        agent = Agent(
            backend,
            sandbox,
            bus,
            run_id="window",
            budget=Budget(max_steps=1, max_time_s=300),
            tools=[BareShell()],
        )
        result = await agent.run(task, "You are a test agent.", resume=resume)
    await backend.close()
    return result, events


async def test_a_prompt_past_the_window_is_condensed_harder_once(
    small_window_model: Path, tmp_path: Path
) -> None:
    """The newest messages are beyond the agent's usual condensing (it keeps the last four); the
    backend's ContextOverflow makes the loop condense once more and the call then fits."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "shell", "arguments": {"command": "cat log"}},
    }
    messages = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "Read the log."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "shell", "content": "error: disk full\n" * 400},
        {"role": "user", "content": "Go on."},
    ]
    counter = EngineBackend(small_window_model, device="cpu", progress=None)  # counts, loads nothing
    assert Condenser(WINDOW).condense(messages, lambda m: counter.count_tokens(m, [SHELL_TOOL])) is None
    resume = ResumeState(run_id="window", task="Read the log.", messages=messages)
    result, events = await run_agent(small_window_model, repo, "Read the log.", resume)

    assert result.outcome == "budget_exhausted", result.message  # the one allowed step ran
    condensed = [e for e in events if isinstance(e, ContextCondensed)]
    assert len(condensed) == 1 and condensed[0].dropped == ["output of shell command=cat log"]
    assert condensed[0].tokens_before >= WINDOW > condensed[0].tokens_after
    turns = [e for e in events if isinstance(e, ModelResponded)]
    assert len(turns) == 1 and turns[0].prompt_tokens == condensed[0].tokens_after
    (refused,) = [e for e in events if isinstance(e, PromptRefused)]
    assert refused.prompt_tokens >= WINDOW == refused.context_window
    figures = summed_up(events)  # the refused prompt is no call; the condensed one is
    assert figures.steps == 1 and figures.tokens_in == turns[0].prompt_tokens
    assert figures.final().startswith("1 model call, 1 prompt(s) refused as too long for the context window;")


async def test_a_prompt_that_cannot_fit_stops_the_run_with_a_clear_message(
    small_window_model: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    result, events = await run_agent(small_window_model, repo, "Fix this: " + "the build fails. " * 600)
    assert (result.outcome, result.exit_code) == ("error", ExitCode.AGENT_ERROR)
    assert result.message.startswith("the system prompt and the task alone are ")
    assert f"this model's context window holds {WINDOW:,}" in result.message
    assert "no model call was made" in result.message and "Condensing" not in result.message
    assert not any(isinstance(e, ModelResponded) for e in events)
    assert len([e for e in events if isinstance(e, PromptRefused)]) == 1
    figures = summed_up(events)
    assert (figures.steps, figures.tokens_in, figures.cut_off) == (0, 0, 0)
    assert figures.final() == "no model call made"


def summed_up(events: list[Event]) -> RunFigures:
    """The figures ``fix`` shows, from a run's events."""
    figures = RunFigures()
    for event in events:
        figures(event)
    return figures


def decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "clover-engine-decode" and t.is_alive()]


@pytest.mark.slow
async def test_an_interrupt_stops_the_engine_mid_block(tmp_path: Path) -> None:
    """Interrupted while a block is being denoised: the call is cancelled, the decoding thread ends,
    and the agent waits for the user's message, then goes on with the same engine."""
    model = write_tiny_checkpoint(tmp_path / "ckpt", seed=5)  # not peaked: about one slot per pass
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    backend = EngineBackend(
        model, device="cpu", sampling=SamplingParams.greedy(), max_new_tokens=4096, progress=None
    )
    bus = EventBus()
    events: list[Event] = []
    blocks = asyncio.Event()

    def record(event: Event) -> None:
        events.append(event)
        if isinstance(event, ProvisionalBlock):
            blocks.set()

    bus.subscribe(record)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        agent = Agent(backend, sandbox, bus, run_id="stop-engine", budget=Budget(max_steps=1, max_time_s=900))
        run = asyncio.create_task(agent.run("Write a lot.", "You are a test agent."))
        await asyncio.wait_for(blocks.wait(), 600)  # a block is being denoised
        assert agent.interrupt()
        async with asyncio.timeout(120):
            while not any(isinstance(e, CallInterrupted) for e in events) or decode_threads():
                await asyncio.sleep(0.05)
        assert not run.done() and agent.steering.paused  # waiting for the user, not ended
        assert not any(isinstance(e, ModelResponded) for e in events)
        backend.max_new_tokens = 8  # the next answer is short
        agent.send("Keep it short.")
        result = await asyncio.wait_for(run, 600)
    await backend.close()
    assert result.outcome == "budget_exhausted", result.message  # the one allowed step was taken
    assert sum(isinstance(e, ModelResponded) for e in events) == 1
    users = [m["content"] for m in agent.messages if m["role"] == "user"]
    assert users[1:3] == [INTERRUPTED_REPLY, "Keep it short."]
