"""Small hand-written tool specs (OpenAI function format) shared by the backend and protocol tests:
a ``shell`` with a strict schema and a ``finish``. They are not the registry's specs, so that a test
knows exactly what it sends and parses against."""

from __future__ import annotations

from typing import Any

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer", "minimum": 1}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
FINISH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "finish",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
}
SHELL_AND_FINISH: list[dict[str, Any]] = [SHELL_TOOL, FINISH_TOOL]
