"""``finish``: the model says the task is done and why; the agent loop stops."""

from __future__ import annotations

from typing import Any, ClassVar

from clover_agent.tools.base import Tool, ToolContext, ToolResult


class FinishTool(Tool):
    name = "finish"
    description = (
        "Call this when the task is done (or cannot be done) to end it. `summary` says what was changed "
        "and how it was verified, or why the task could not be completed."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "summary": {
                "type": "string",
                "minLength": 1,
                "description": "What was done and how it was checked.",
            },
        },
        "required": ["summary"],
        "additionalProperties": False,
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(True, "Task finished.", {"summary": args["summary"]}, ends_task=True)
