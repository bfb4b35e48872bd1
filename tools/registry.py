"""The tools the model can call, by name, and the one entry point that runs a call.

``execute`` never raises: a bad call (unknown tool, arguments that break the schema, refused
path, missing file) and an unexpected failure both come back as ``ToolResult(ok=False, ...)``
with a message the model can act on. A sandbox that stopped working (its runner or container died)
is marked in the result's data under :data:`SANDBOX_LOST`, so callers can end the run with a
:class:`SandboxError` instead of carrying on with a dead sandbox. Failures are logged as one warning
line; the traceback is logged at debug level only, since the result already carries the failure.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from clover_agent.sandboxes.base import Sandbox, SandboxArgumentError, SandboxError
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult, valid_unicode
from clover_agent.tools.editor import EditorTool
from clover_agent.tools.finish import FinishTool
from clover_agent.tools.run_tests import RunTestsTool
from clover_agent.tools.search import SearchTool
from clover_agent.tools.shell import ShellTool

log = logging.getLogger(__name__)

#: Key in :attr:`ToolResult.data` holding why the sandbox stopped working during the call.
SANDBOX_LOST = "sandbox_lost"

TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in (EditorTool(), ShellTool(), RunTestsTool(), SearchTool(), FinishTool())
}


def get_tool(name: str) -> Tool:
    """The tool called ``name``; :class:`KeyError` with the known names otherwise."""
    try:
        return TOOLS[name]
    except KeyError:
        raise KeyError(f"unknown tool {name!r}; known tools: {', '.join(TOOLS)}") from None


def tool_specs(names: list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI-style specs of the named tools (all of them by default), in registry order."""
    if names is None:
        return [tool.spec() for tool in TOOLS.values()]
    return [get_tool(name).spec() for name in names]


async def execute(name: str, args: dict[str, Any] | str, sandbox: Sandbox | ToolContext) -> ToolResult:
    """Validate and run one call. Never raises (except cancellation).

    ``args`` may be a JSON string (as some backends deliver it). Passing the sandbox uses its
    :meth:`ToolContext.of` context, so edit history and the shell session carry over between
    calls of one task.
    """
    ctx = sandbox if isinstance(sandbox, ToolContext) else ToolContext.of(sandbox)
    tool = TOOLS.get(name)
    if tool is None:
        return ToolResult(False, f"Unknown tool `{name}`. Available tools: {', '.join(TOOLS)}.")
    started = time.monotonic()
    try:
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolError(f"Invalid arguments for tool `{name}`: not valid JSON ({exc}).") from None
        tool.validate(args)
        result = await tool.run(args, ctx)
    except ToolError as exc:
        result = ToolResult(False, str(exc))
    except SandboxArgumentError as exc:  # refused before it reached the sandbox, which lives on
        result = ToolResult(False, f"The tool `{name}` could not run: {exc}.")
    except OSError as exc:  # a file operation failed while the sandbox lives (a timeout, a FIFO, ...)
        where = f" ({exc.filename})" if exc.filename else ""
        result = ToolResult(False, f"The tool `{name}` failed{where}: {exc.strerror or exc}.")
    except SandboxError as exc:
        log.warning("tool %s: the sandbox stopped working: %s", name, exc)
        log.debug("tool %s: traceback of the sandbox failure", name, exc_info=True)
        result = ToolResult(
            False,
            f"The tool `{name}` failed because the sandbox stopped working: {exc}",
            {SANDBOX_LOST: str(exc)},
        )
    except Exception as exc:
        log.warning("tool %s failed unexpectedly: %s: %s", name, type(exc).__name__, exc)
        log.debug("tool %s: traceback of the failure", name, exc_info=True)
        result = ToolResult(
            False,
            f"The tool `{name}` failed unexpectedly: {type(exc).__name__}: {exc}",
            {"exception": repr(exc)},
        )
    result.output = valid_unicode(result.output)
    result.data = valid_unicode(result.data)
    result.data.setdefault("duration_s", round(time.monotonic() - started, 3))
    return result
