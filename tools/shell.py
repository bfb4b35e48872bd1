"""``shell``: bash commands in a persistent session (``cd`` and ``export`` carry over).

Each call runs in a fresh ``bash`` through ``Sandbox.exec``; the session (working folder and
exported variables) lives in a state file inside the sandbox, restored before the command and
saved by an ``EXIT`` trap. Not one long-lived bash, so a timeout kills the command's whole process
group and nothing stays wedged. What carries over and what is lost: docs/tools.md ("How each tool
behaves").
"""

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from clover_agent.sandboxes.base import OutputSink
from clover_agent.tools.base import Tool, ToolContext, ToolResult, head_tail

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 3600.0
#: The state files' folder, under the sandbox's ``$TMPDIR`` (default ``/tmp``).
STATE_SUBDIR = ".clover-shell"
STATE_HEADER = "# clover-shell-state v1"
_NOTICE = "__clover_shell_notice__:"

NOTICES = {
    "corrupt": "[The shell session's saved state could not be read, so a new session was started in "
    "/workspace: earlier `cd` and `export` were lost.]",
    "cwd_gone": "[The session's working directory no longer exists; this command ran in /workspace.]",
}

# The EXIT trap covers `exit` and `set -e` inside the command; the explicit save after it covers a
# command that replaced the trap with its own. The state file is sourced at top level (inside a function
# `declare -x` would make locals). `export -p` quotes values so that sourcing restores them. Every
# step but the final rename is a bash builtin (no process started: each costs a millisecond or
# more).
_SCRIPT = r"""
__clover_notice=
[ -d "${__clover_state%/*}" ] || mkdir -p "${__clover_state%/*}" 2>/dev/null
if [ -e "$__clover_state" ]; then
  __clover_lines=()
  mapfile -t __clover_lines < "$__clover_state" 2>/dev/null
  if [ "${#__clover_lines[@]}" -ge 2 ] && [ "${__clover_lines[0]}" = "@HEADER@" ] && [ "${__clover_lines[${#__clover_lines[@]}-1]}" = "# end" ]; then
    . "$__clover_state" >/dev/null 2>&1
  else
    __clover_notice=corrupt
    __clover_cwd=
  fi
  unset __clover_lines
fi
if [ -n "$__clover_cwd" ] && ! cd -- "$__clover_cwd" 2>/dev/null; then
  __clover_notice=${__clover_notice:-cwd_gone}
fi
unset __clover_cwd
[ -n "$__clover_notice" ] && printf '@NOTICE@%s\n' "$__clover_notice"
__clover_save() {
  umask 077  # the command is over: its umask is no longer needed (and is not saved)
  {
    printf '%s\n' "@HEADER@"
    export -p
    printf '__clover_cwd=%q\n' "$PWD"
    printf '# end\n'
  } 2>/dev/null > "$__clover_state.tmp" && mv -f "$__clover_state.tmp" "$__clover_state" 2>/dev/null
}
trap __clover_save EXIT
exec </dev/null
eval "$__clover_command"
__clover_status=$?
__clover_save
exit $__clover_status
"""


def shell_script(session_id: str, command: str) -> str:
    """The ``bash -c`` line that runs ``command`` inside the saved session ``session_id``."""
    body = _SCRIPT.replace("@HEADER@", STATE_HEADER).replace("@NOTICE@", _NOTICE)
    state_file = shlex.quote(f"{STATE_SUBDIR}/{session_id}")
    return f'__clover_state="${{TMPDIR:-/tmp}}"/{state_file}\n__clover_command={shlex.quote(command)}\n{body}'


class _WithoutNotice:
    """Hands the streamed output on without the session's notice line (the script's first line,
    when there is one: the result says it in words)."""

    def __init__(self, sink: OutputSink) -> None:
        self.sink = sink
        self.head: str | None = ""  # held while it may still be the notice line; None: passed it

    def __call__(self, piece: str) -> None:
        if self.head is None:
            self.sink(piece)
            return
        head = self.head + piece
        if not (head.startswith(_NOTICE) or _NOTICE.startswith(head)):
            self.head = None
            self.sink(head)
        elif "\n" in head:
            self.head = None
            rest = head.partition("\n")[2]
            if rest:
                self.sink(rest)
        else:
            self.head = head


class ShellTool(Tool):
    name = "shell"
    description = (
        "Run a bash command in the workspace (a persistent session that starts in /workspace: `cd` and "
        "`export` carry over to later calls). No input can be given to the command (stdin is empty), so use "
        "non-interactive flags (e.g. `-y`, `--no-pager`). Background processes end with the command. "
        "A long output is cut to its beginning and end. "
        f"The command is killed, with everything it started, after `timeout` seconds (default {DEFAULT_TIMEOUT_S:g})."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "description": "The bash command to run."},
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_TIMEOUT_S,
                "description": f"Seconds before the command is killed (default {DEFAULT_TIMEOUT_S:g}).",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def mutates(self, args: dict[str, Any]) -> bool:
        return True  # any command may

    def command_line(self, args: dict[str, Any]) -> str | None:
        command = args.get("command")
        return command if isinstance(command, str) else None

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = float(args.get("timeout", DEFAULT_TIMEOUT_S))
        sink = None if ctx.on_output is None else _WithoutNotice(ctx.on_output)
        result = await ctx.sandbox.exec(
            shell_script(ctx.session_id, args["command"]), timeout=timeout, on_output=sink
        )
        output = result.output
        notice = ""
        if output.startswith(_NOTICE):
            first, _, output = output.partition("\n")
            notice = NOTICES.get(first[len(_NOTICE) :], "")
        shown = head_tail(output)
        parts = [notice] if notice else []
        if shown:
            parts.append(shown.rstrip("\n"))
        if result.timed_out:
            parts.append(
                f"[The command timed out after {timeout:g} s; it and every process it started were killed. "
                "The shell session is still usable, but `cd` and `export` from this command were not kept.]"
            )
        else:
            if result.killed_reason:
                parts.append(f"[The command was stopped: {result.killed_reason}.]")
        if result.disk_full:
            parts.append(
                f"[Out of space: {result.disk_full}. Delete files you do not need (build output, caches, "
                "large generated files) before writing more.]"
            )
        if not result.timed_out:
            parts.append(f"[exit code: {result.exit_code}]")
        return ToolResult(
            ok=not result.timed_out and result.exit_code == 0,
            output="\n".join(parts),
            data={
                "command": args["command"],
                "output": output,
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "killed_reason": result.killed_reason,
                "disk_full": result.disk_full,
                "duration_s": result.duration_s,
                "session_reset": notice != "",
            },
        )
