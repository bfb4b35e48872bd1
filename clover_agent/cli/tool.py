"""``clover-agent tool NAME 'JSON-ARGS'``: run one tool call in a sandbox and print its result.

The sandbox works on a private copy of ``--workdir``; the folder itself is never changed. After the
call, the changes the tool made to the copy (if any) are printed as a diff, so an edit can be
checked and applied by hand (``git apply``). Exit 0 when the call succeeded, 1 on a tool error
(including a shell command that exited non-zero or failing tests), 2 on bad arguments, 4 when the
sandbox is unavailable or stops working during the call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.errors import ExitCode, UsageError
from clover_agent.safe_text import terminal_safe

if TYPE_CHECKING:
    from clover_agent.sandboxes.base import SandboxSpec


async def run_tool_call(name: str, args: dict[str, Any], kind: str, spec: SandboxSpec) -> tuple[Any, str]:
    """(ToolResult, diff of the sandbox copy) for one call in a fresh sandbox made from ``spec``."""
    from clover_agent.sandboxes.errors import SandboxError
    from clover_agent.sandboxes.factory import create_sandbox
    from clover_agent.tools.registry import SANDBOX_LOST, execute

    async with create_sandbox(kind, spec) as sandbox:
        result = await execute(name, args, sandbox)
        if SANDBOX_LOST in result.data:
            raise SandboxError(
                f"the sandbox stopped working during the {name} call: {result.data[SANDBOX_LOST]}"
            )
        return result, await sandbox.diff()


def _tool(args: argparse.Namespace) -> int:
    try:
        call_args = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        raise UsageError(f'ARGS is not valid JSON ({exc}); e.g. \'{{"command": "ls"}}\'') from None
    if not isinstance(call_args, dict):
        raise UsageError('ARGS must be a JSON object, e.g. \'{"command": "ls"}\'')
    workdir = Path(args.workdir).expanduser().resolve()
    if not workdir.is_dir():
        raise UsageError(f"--workdir {args.workdir} is not a folder")
    from clover_agent.launch import sandbox_spec
    from clover_agent.settings import Settings

    spec = sandbox_spec(Settings.load(), workdir, image=args.image)
    result, diff = asyncio.run(run_tool_call(args.name, call_args, args.sandbox, spec))
    if args.json:
        payload = {
            "tool": args.name,
            "ok": result.ok,
            "output": result.output,
            "data": result.data,
            "ends_task": result.ends_task,
            "diff": diff,
        }
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(terminal_safe(result.output.rstrip("\n")))  # a command's output: shown, never obeyed
        if diff:
            print(f"\n--- changes made in the sandbox's copy ({workdir} itself is unchanged) ---")
            print(terminal_safe(diff.rstrip("\n")))
    return ExitCode.OK if result.ok else ExitCode.FAILURE


def register(sub: argparse._SubParsersAction) -> None:
    from clover_agent.tools.registry import TOOL_NAMES

    p = sub.add_parser(
        "tool",
        help="run one tool call (editor, shell, run_tests, search, finish) in a sandbox",
        description="Run one tool call in a sandbox over a private copy of --workdir and print the result, "
        "then the diff of what it changed in the copy (the folder itself is never modified). "
        "Exit 0 on success, 1 on a tool error, 2 on bad arguments, 4 when the sandbox is unavailable.",
        epilog="""example: clover-agent tool editor '{"command": "view", "path": "/workspace"}' --sandbox local""",
    )
    p.add_argument("name", choices=TOOL_NAMES, metavar="NAME", help=f"the tool: {', '.join(TOOL_NAMES)}")
    p.add_argument("arguments", metavar="ARGS", help="the call's arguments as a JSON object")
    p.add_argument(
        "--sandbox", choices=["docker", "local"], default="docker", help="where to run it (default: docker)"
    )
    p.add_argument(
        "--workdir", default=".", metavar="DIR", help="repository to copy into /workspace (default: .)"
    )
    p.add_argument("--image", metavar="IMG", help="Docker image (default: the configured sandbox image)")
    p.add_argument("--json", action="store_true", help="print the result (and diff) as JSON")
    p.set_defaults(func=_tool)
