"""The loop with the in-process engine on a tiny random checkpoint: a bounded number of steps.

The model's text is noise (random weights); what is checked is the machinery: the prompt is the
checkpoint's chat template rendering of the loop's conversation, provisional blocks and text stream
as events, and turns without a usable tool call are fed back to the model instead of breaking the run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clover_agent.agent import Agent, Budget, TrajectoryWriter, load_trajectory
from clover_agent.agent.trajectory import read_events
from clover_agent.backends.engine import EngineBackend
from clover_agent.engine.chat import bundled_chat_template
from clover_agent.engine.sampling import SamplingParams
from clover_agent.engine.tiny import write_tiny_checkpoint
from clover_agent.errors import ExitCode
from clover_agent.events import ErrorReported, EventBus, ModelDelta, ModelResponded, ProvisionalBlock
from clover_agent.sandboxes import SandboxSpec, create_sandbox

TEMPLATE_MARK = "[tiny-checkpoint-template]"
STEPS = 3


@pytest.mark.slow
async def test_engine_drives_a_bounded_loop(tmp_path: Path) -> None:
    model = write_tiny_checkpoint(tmp_path / "ckpt", peaked=True, seed=5)
    (model / "chat_template.jinja").write_text(TEMPLATE_MARK + bundled_chat_template(), encoding="utf-8")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("A = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)

    backend = EngineBackend(
        model, device="cpu", sampling=SamplingParams.greedy(), max_new_tokens=40, progress=None
    )
    bus = EventBus()
    writer = TrajectoryWriter(tmp_path / "trajectory.jsonl")
    bus.subscribe(writer)
    async with create_sandbox("local", SandboxSpec(repo=str(repo))) as sandbox:
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

    # The first prompt is the checkpoint's template rendering of the loop's first two messages.
    state = load_trajectory(tmp_path / "trajectory.jsonl")
    first_prompt = backend.prompt(state.messages[:2], agent.tools)
    assert first_prompt.startswith(TEMPLATE_MARK) and "You are a test agent." in first_prompt
    assert turns[0].prompt_tokens == backend.count_tokens(state.messages[:2], agent.tools)

    # Noise is not a tool call: each such turn is answered with a message to the model, no crash.
    for i, event in enumerate(events):
        if isinstance(event, ModelResponded) and not event.tool_calls:
            added, error, feedback = events[i + 1 : i + 4]
            assert added.message["role"] == "assistant" and added.message["content"] == event.content
            assert isinstance(error, ErrorReported) and error.kind == "format"
            assert feedback.message == {"role": "user", "content": error.message}
