"""The ``plan`` mode, driven by the SDK's client: while planning the agent only looks (its edit and
its command are refused, the user's tree and the sandbox unchanged), its plan comes as a ``plan``
update and a question; approved, the session switches to the chosen mode and the agent carries the
plan out, each step's progress a ``plan`` update; kept, it stays in plan mode and the next prompt
revises the plan. A loaded session shows its plan again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acp import schema

from tests.acp.helpers import RecordingClient, agent_args, check_conformance, prompt, running_agent
from tests.tui.helpers import FIX_ADD, calculator_repo, call, turn, write_replay

BUGGY = "    return a - b"
FIXED = "    return a + b"
STEPS = ["Make add() add", "Run the tests"]
PROPOSE = call(
    "propose_plan",
    summary="add() subtracts; make it add.",
    steps=json.dumps(STEPS),
    files=json.dumps(["calculator.py"]),
    checks=json.dumps(["tests/test_calculator.py passes"]),
)


def progress(*statuses: str) -> str:
    return call(
        "update_plan",
        steps=json.dumps([{"step": s, "status": t} for s, t in zip(STEPS, statuses, strict=True)]),
    )


def _plans(client: RecordingClient) -> list[list[tuple[str, str]]]:
    return [[(e.content, e.status) for e in u.entries] for u in client.of(schema.AgentPlanUpdate)]


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_plan_mode_looks_first_then_carries_the_approved_plan_out(tmp_path: Path, sandbox: str) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "plan.jsonl",
        [
            turn("Reading first.", call("editor", command="view", path="/workspace/calculator.py")),
            turn("", FIX_ADD),  # refused: planning
            turn("", call("shell", command="sed -i 's/a - b/a + b/' /workspace/calculator.py")),  # refused
            turn("Here is the plan.", PROPOSE),
            # kept planning; the next prompt asks for one more check, and the plan comes again
            turn("", PROPOSE),
            # approved under auto
            turn("", progress("in_progress", "pending")),
            turn("", FIX_ADD),
            turn("", progress("completed", "in_progress"), call("run_tests")),
            turn("", progress("completed", "completed")),
            turn("", call("finish", summary="add() adds.")),
        ],
    )
    client = RecordingClient(answers=["plan:keep", "plan:auto", "apply"])
    async with running_agent(agent_args(replay, sandbox), tmp_path / "agent.log", client) as agent:
        session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        assert session.modes is not None and "plan" in [m.id for m in session.modes.available_modes]
        await agent.conn.set_session_mode(session_id=session.session_id, mode_id="plan")

        assert (await prompt(agent, session.session_id, "fix add")).stop_reason == "end_turn"
        finished = {u.tool_call_id: u for u in client.of(schema.ToolCallProgress) if u.status}
        refused = [
            u for u in finished.values() if u.status == "failed" and "not allowed" in str(u.raw_output)
        ]
        assert len(refused) == 2 and all("'plan'" in str(u.raw_output) for u in refused), finished
        assert BUGGY in (repo / "calculator.py").read_text()
        (asked,) = client.permissions
        assert asked.tool_call.title == "Approve the plan (2 steps)"
        assert [o.option_id for o in asked.options] == ["plan:auto", "plan:ask", "plan:keep"]
        assert _plans(client) == [[(s, "pending") for s in STEPS]]
        assert "Still planning" in client.text() or any(
            "Still planning" in str(u.content) for u in client.of(schema.ToolCallProgress)
        )

        # still in plan mode: the next prompt goes on planning; this time the plan is approved
        assert (await prompt(agent, session.session_id, "also run the tests")).stop_reason == "end_turn"
        modes = [u.current_mode_id for u in client.of(schema.CurrentModeUpdate)]
        assert modes[-2:] == ["plan", "auto"], modes
        assert FIXED in (repo / "calculator.py").read_text()  # carried out, and handed back
        statuses = [[status for _, status in plan] for plan in _plans(client)]
        assert statuses == [
            ["pending", "pending"],  # proposed (kept)
            ["pending", "pending"],  # proposed again
            ["pending", "pending"],  # approved
            ["in_progress", "pending"],
            ["completed", "in_progress"],
            ["completed", "completed"],
        ]
        assert [p.tool_call.tool_call_id.split("-")[0] for p in client.permissions] == [
            "plan",
            "plan",
            "handback",
        ]
    check_conformance(agent.messages)

    # loaded later: the conversation and its plan come back
    loader = RecordingClient()
    async with running_agent(agent_args(replay, sandbox), tmp_path / "load.log", loader) as agent:
        await agent.conn.load_session(cwd=str(repo), session_id=session.session_id, mcp_servers=[])
        assert [status for _, status in _plans(loader)[-1]] == ["completed", "completed"]
    check_conformance(agent.messages)
