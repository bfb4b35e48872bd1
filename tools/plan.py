"""``propose_plan`` and ``update_plan``: the agent's plan, as data a front end can show and track.

In plan mode the agent only looks (the ``plan`` policy: read, search, run tests) and ends its turn
with ``propose_plan``: the steps, the files it means to change and how the change will be checked.
Once a person approves the plan, ``update_plan`` marks its steps as they start and end. Both tools
only return the plan in their result's data (:data:`PLAN_DATA`); the agent loop turns it into a
``PlanUpdated`` event and, for a proposal made in plan mode, ends the turn.
"""

from __future__ import annotations

from typing import Any, ClassVar

from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult

#: Key in :attr:`ToolResult.data`: the plan a call proposed or updated (``Plan.to_dict`` form).
PLAN_DATA = "plan"
#: What a step may be.
STEP_STATUSES = ("pending", "in_progress", "completed")
#: At most this many steps, files or checks (a plan is read by a person).
MAX_ITEMS = 50
MAX_ITEM_CHARS = 500

_STRINGS = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": MAX_ITEM_CHARS},
    "maxItems": MAX_ITEMS,
}


class ProposePlanTool(Tool):
    name = "propose_plan"
    description = (
        "In plan mode, end your turn with this once you know what to do: the plan the user approves "
        "before anything is changed. `steps` are the changes in order, `files` the files you will "
        "change, `checks` how the result will be checked (tests to run)."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "minLength": 1, "description": "The plan in a sentence or two."},
            "steps": {**_STRINGS, "minItems": 1, "description": "The steps, in order."},
            "files": {**_STRINGS, "description": "The files the plan changes."},
            "checks": {**_STRINGS, "description": "How the change will be checked."},
        },
        "required": ["summary", "steps"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        plan = {
            "summary": args["summary"].strip(),
            "steps": [{"step": s.strip(), "status": "pending"} for s in args["steps"]],
            "files": [f.strip() for f in args.get("files") or []],
            "checks": [c.strip() for c in args.get("checks") or []],
        }
        return ToolResult(True, "Plan proposed: the user reads it now.", {PLAN_DATA: plan})


class UpdatePlanTool(Tool):
    name = "update_plan"
    description = (
        "Keep the approved plan's steps up to date as you work: give every step with its status "
        "(pending, in_progress, completed), in order. At most one step is in_progress."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_ITEMS,
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string", "minLength": 1, "maxLength": MAX_ITEM_CHARS},
                        "status": {"type": "string", "enum": list(STEP_STATUSES)},
                    },
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["steps"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        steps = [{"step": s["step"].strip(), "status": s["status"]} for s in args["steps"]]
        if sum(s["status"] == "in_progress" for s in steps) > 1:
            raise ToolError("At most one step may be in_progress; mark the others pending or completed.")
        done = sum(s["status"] == "completed" for s in steps)
        return ToolResult(
            True, f"Plan updated: {done} of {len(steps)} steps completed.", {PLAN_DATA: {"steps": steps}}
        )
