"""Plan mode in the agent core, with real tools in real sandboxes and replayed turns: nothing changes
before a plan is approved (edits and commands refused by the plan policy, the workspace untouched),
the run ends ``planned`` with the plan, approval (of an edited plan) carries it into the
conversation under the chosen policy, and ``update_plan`` tracks its steps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clover_agent.agent import Agent, Approvals
from clover_agent.agent.plan import PLAN_POLICY, Plan, PlanStep, parse_plan
from clover_agent.agent.policy import preset
from clover_agent.errors import UsageError
from clover_agent.events import Done, EventBus, PlanUpdated, ToolCallFinished
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.registry import default_tools, plan_tools
from tests.clover_agent.test_agent_loop import FINISH, VIEW, call
from tests.clover_agent.test_agent_seams import Recorder, replay
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

ORIGINAL = "def greet(name):\n    return 'hello ' + name\n"
EDIT = call(
    "editor",
    command="str_replace",
    path="/workspace/greet.py",
    old_str="'hello ' + name",
    new_str="f'hello {name}!'",
)
SHELL = call("shell", command="echo planned > /workspace/marker.txt")
PROPOSE = call(
    "propose_plan",
    summary="Greet with an f-string and an exclamation mark.",
    steps=json.dumps(["Change greet() in greet.py", "Run the tests"]),
    files=json.dumps(["greet.py"]),
    checks=json.dumps(["pytest -q"]),
)


def progress(*statuses: str) -> str:
    steps = [
        {"step": s, "status": st} for s, st in zip(["Change greet()", "Check it"], statuses, strict=True)
    ]
    return call("update_plan", steps=json.dumps(steps))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"greet.py": ORIGINAL})


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def sandbox(request: pytest.FixtureRequest, repo: Path) -> AsyncIterator[Sandbox]:
    async with create_sandbox(request.param, sandbox_spec(repo)) as box:
        yield box


async def test_plan_mode_is_read_only_until_the_plan_is_approved_then_tracks_its_steps(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    backend = replay(
        tmp_path / "plan.jsonl",
        EDIT,  # refused: plan mode
        SHELL,  # refused too
        VIEW,
        PROPOSE,  # the turn ends with the plan
        progress("in_progress", "pending"),
        EDIT,
        progress("completed", "in_progress"),
        progress("completed", "completed"),
        FINISH,
    )
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(
        backend,
        sandbox,
        bus,
        run_id="plan",
        policy=preset("workspace"),
        approvals=Approvals(),
        tools=[*default_tools(), *plan_tools()],
        conversation=True,
    )
    agent.start_planning()
    assert agent.planning and agent.policy is PLAN_POLICY
    result = await agent.run("Make the greeting friendlier.", "You are a test agent.")

    assert result.outcome == "planned" and result.ended_well, result.message
    assert result.plan is not None
    assert [s.step for s in result.plan.steps] == ["Change greet() in greet.py", "Run the tests"]
    assert result.plan.files == ["greet.py"] and result.plan.checks == ["pytest -q"]
    refused = [e.output for e in seen.of(ToolCallFinished)][:2]
    assert all("not allowed" in out and "'plan'" in out for out in refused), refused
    assert await sandbox.read_file("/workspace/greet.py") == ORIGINAL.encode()
    assert result.patch == ""  # nothing changed
    assert "Plan mode" in agent.messages[1]["content"]  # the request carried the note
    done = seen.of(Done)[-1]
    assert done.outcome == "planned" and done.plan == result.plan.to_dict()
    assert [e.stage for e in seen.of(PlanUpdated)] == ["proposed"]

    # The person edits the plan (one step reworded, one added) and approves it under `workspace`.
    edited = parse_plan(result.plan.markdown().replace("Run the tests", "Check it"))
    edited.steps = [PlanStep("Change greet()"), PlanStep("Check it")]
    message = agent.approve_plan(edited, preset("workspace"))
    assert not agent.planning and agent.policy.name == "workspace"
    assert "approved" in message and "Change greet()" in message and "Check it" in message
    result = await agent.continue_with(message)

    assert result.submitted, result.message
    assert "f'hello {name}!'" in (await sandbox.read_file("/workspace/greet.py")).decode()
    assert "Plan mode" not in agent.messages[-1].get("content", "")
    stages = [(e.stage, [s["status"] for s in e.plan["steps"]]) for e in seen.of(PlanUpdated)]
    assert stages == [
        ("proposed", ["pending", "pending"]),
        ("approved", ["pending", "pending"]),
        ("progress", ["in_progress", "pending"]),
        ("progress", ["completed", "in_progress"]),
        ("progress", ["completed", "completed"]),
    ]
    assert agent.plan is not None and agent.plan.done == 2


async def test_leaving_plan_mode_restores_the_policy_and_a_proposal_outside_it_is_only_tracked(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    backend = replay(tmp_path / "outside.jsonl", PROPOSE, EDIT, FINISH)
    bus = EventBus()
    seen = Recorder(bus)
    agent = Agent(
        backend,
        sandbox,
        bus,
        run_id="outside",
        policy=preset("workspace"),
        tools=[*default_tools(), *plan_tools()],
    )
    agent.start_planning()
    agent.start_planning()  # twice: still one way back
    agent.leave_planning()
    assert not agent.planning and agent.policy.name == "workspace"
    result = await agent.run("Make the greeting friendlier.", "You are a test agent.")
    assert result.submitted, result.message  # the proposal did not end the turn
    assert [e.stage for e in seen.of(PlanUpdated)] == ["progress"]
    assert "Plan mode" not in agent.messages[1]["content"]


def test_a_plan_reads_back_from_its_markdown_and_an_edit_without_steps_is_refused() -> None:
    plan = Plan(
        "Fix add.",
        [PlanStep("Read calculator.py", "completed"), PlanStep("Fix `add`", "in_progress"), PlanStep("Test")],
        ["calculator.py"],
        ["pytest tests/test_calculator.py"],
    )
    again = parse_plan(plan.markdown())
    assert again == plan
    written = parse_plan("Do it\n\n- first\n- second\n\n## Checks\n* pytest\n")
    assert [s.step for s in written.steps] == ["first", "second"] and written.checks == ["pytest"]
    with pytest.raises(UsageError, match="no steps"):
        parse_plan("Just words, no list.\n## Files\n- a.py\n")
