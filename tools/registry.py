"""The standard tools, and the one function that runs a call on a tool.

Whoever runs calls owns its tool objects: the agent gets them as ``Agent(tools=[...])`` (by
default :func:`default_tools`), ``clover-agent tool`` makes its own. :func:`run_call` never raises:
a bad call (arguments that break the schema, a refused path, a missing file) and an unexpected
failure both come back as ``ToolResult(ok=False, ...)`` with a message the model can act on. A
sandbox that stopped working (its runner or container died) is marked in the result's data under
:data:`SANDBOX_LOST`, so callers can end the run with a :class:`SandboxError` instead of carrying on
with a dead sandbox. Failures are logged as one warning line; the traceback is logged at debug
level only, since the result already carries the failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from clover_agent.sandboxes.base import Sandbox, SandboxArgumentError, SandboxError
from clover_agent.tools.base import Tool, ToolContext, ToolError, ToolResult, valid_unicode
from clover_agent.tools.editor import EditorTool
from clover_agent.tools.finish import FinishTool
from clover_agent.tools.plan import ProposePlanTool, UpdatePlanTool
from clover_agent.tools.run_tests import RunTestsTool
from clover_agent.tools.search import SearchTool
from clover_agent.tools.shell import ShellTool

log = logging.getLogger(__name__)

#: Key in :attr:`ToolResult.data` holding why the sandbox stopped working during the call.
SANDBOX_LOST = "sandbox_lost"
#: Key in :attr:`ToolResult.data`: the names of tools withdrawn for the rest of the run (an MCP
#: server that stopped); the agent stops offering them.
TOOLS_GONE = "tools_gone"

#: The standard tools' names, in the order the model is shown them.
TOOL_NAMES: tuple[str, ...] = ("editor", "shell", "run_tests", "search", "finish")


def default_tools() -> list[Tool]:
    """New instances of the standard tools (editor, shell, run_tests, search, finish)."""
    return [EditorTool(), ShellTool(), RunTestsTool(), SearchTool(), FinishTool()]


def plan_tools() -> list[Tool]:
    """New instances of the plan tools (``propose_plan``, ``update_plan``): given to agents that can
    plan (the TUI's, the editor's, ``fix --plan``'s)."""
    return [ProposePlanTool(), UpdatePlanTool()]


def tool_specs(tools: Sequence[Tool] | None = None) -> list[dict[str, Any]]:
    """OpenAI-style specs of ``tools`` (default: the standard ones), in order."""
    return [tool.spec() for tool in (default_tools() if tools is None else tools)]


async def run_call(
    tool: Tool, args: dict[str, Any], ctx: ToolContext, *, schema_checked: bool = False
) -> ToolResult:
    """Run one call of ``tool``. Never raises (except cancellation). ``schema_checked``: the
    arguments were already checked against the tool's schema (a backend's parser checks every call
    it returns), so that is not done twice."""
    started = time.monotonic()
    try:
        tool.validate(args, schema_checked=schema_checked)
        result = await tool.run(args, ctx)
    except ToolError as exc:
        result = ToolResult(False, str(exc))
    except SandboxArgumentError as exc:  # refused before it reached the sandbox, which lives on
        result = ToolResult(False, f"The tool `{tool.name}` could not run: {exc}.")
    except OSError as exc:  # a file operation failed while the sandbox lives (a timeout, a FIFO, ...)
        where = f" ({exc.filename})" if exc.filename else ""
        result = ToolResult(False, f"The tool `{tool.name}` failed{where}: {exc.strerror or exc}.")
    except SandboxError as exc:
        log.warning("tool %s: the sandbox stopped working: %s", tool.name, exc)
        log.debug("tool %s: traceback of the sandbox failure", tool.name, exc_info=True)
        result = ToolResult(
            False,
            f"The tool `{tool.name}` failed because the sandbox stopped working: {exc}",
            {SANDBOX_LOST: str(exc)},
        )
    except Exception as exc:
        log.warning("tool %s failed unexpectedly: %s: %s", tool.name, type(exc).__name__, exc)
        log.debug("tool %s: traceback of the failure", tool.name, exc_info=True)
        result = ToolResult(
            False,
            f"The tool `{tool.name}` failed unexpectedly: {type(exc).__name__}: {exc}",
            {"exception": repr(exc)},
        )
    result.output = valid_unicode(result.output)
    result.data = valid_unicode(result.data)
    result.data.setdefault("duration_s", round(time.monotonic() - started, 3))
    return result


async def execute(
    name: str, args: dict[str, Any], sandbox: Sandbox | ToolContext, tools: Sequence[Tool] | None = None
) -> ToolResult:
    """Validate and run one call of the tool called ``name`` among ``tools`` (default: the standard
    ones). Never raises (except cancellation). Passing the sandbox uses its
    :meth:`ToolContext.of` context, so edit history and the shell session carry over between calls."""
    ctx = sandbox if isinstance(sandbox, ToolContext) else ToolContext.of(sandbox)
    available = {tool.name: tool for tool in (default_tools() if tools is None else tools)}
    tool = available.get(name)
    if tool is None:
        return ToolResult(False, f"Unknown tool `{name}`. Available tools: {', '.join(available)}.")
    return await run_call(tool, args, ctx)
