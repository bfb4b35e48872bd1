"""The shell tool: a persistent session, timeouts that leave nothing behind, no stdin, head+tail output,
output streamed as it comes (the session's notice left out)."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import OUTPUT_HEAD_BYTES, OUTPUT_TAIL_BYTES, ToolContext
from clover_agent.tools.registry import execute
from clover_agent.tools.shell import STATE_SUBDIR

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Every process's command line, read from /proc (works where `ps` is not installed).
ALL_COMMAND_LINES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


async def shell(ctx: ToolContext, command: str, **extra: object):
    return await execute("shell", {"command": command, **extra}, ctx)


async def count_processes(sandbox: Sandbox, needle: str) -> int:
    listing = await sandbox.exec(ALL_COMMAND_LINES)
    return sum(1 for line in listing.output.splitlines() if line.strip() == needle)


async def state_file(sandbox: Sandbox, ctx: ToolContext) -> str:
    """Where the shell tool keeps ``ctx``'s session: under the sandbox's ``$TMPDIR`` (default /tmp)."""
    tmp = (await sandbox.exec('printf %s "${TMPDIR:-/tmp}"')).output
    return f"{tmp}/{STATE_SUBDIR}/{ctx.session_id}"


async def test_session_keeps_cwd_and_exports(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    first = await shell(ctx, "pwd")
    assert first.ok and first.output == "/workspace\n[exit code: 0]"
    await shell(ctx, "mkdir -p deep/er && cd deep/er && export GREETING='hello world' PLAIN=1")
    second = await shell(ctx, 'pwd; echo "$GREETING"; echo "$PLAIN"')
    assert second.output == "/workspace/deep/er\nhello world\n1\n[exit code: 0]"
    # `exit` in the command still saves the session; the exit code is reported.
    third = await shell(ctx, "cd ..; export MULTI=$'line1\\nline2'; exit 3")
    assert not third.ok and third.output == "[exit code: 3]" and third.data["exit_code"] == 3
    fourth = await shell(ctx, 'pwd; printf "%s|" "$MULTI"')
    assert fourth.output == "/workspace/deep\nline1\nline2|\n[exit code: 0]"
    # A command with its own EXIT trap still has its `cd` kept (and its trap runs).
    trapped = await shell(ctx, "trap 'echo bye' EXIT; cd er")
    assert trapped.output == "bye\n[exit code: 0]"
    assert (await shell(ctx, "pwd")).output == "/workspace/deep/er\n[exit code: 0]"
    # Another task's session starts fresh.
    other = await shell(ToolContext(sandbox), 'pwd; echo "[$GREETING]"')
    assert other.output == "/workspace\n[]\n[exit code: 0]"


async def test_quoting_survives(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    result = await shell(ctx, "printf '%s\\n' \"a b\" 'c$d' \"it's\"; echo `echo back`ticks")
    assert result.output == "a b\nc$d\nit's\nbackticks\n[exit code: 0]"
    syntax = await shell(ctx, "if then fi")
    assert not syntax.ok and "syntax error" in syntax.output
    assert (await shell(ctx, "echo fine")).ok


async def test_timeout_kills_process_group_and_session_survives(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await shell(ctx, "mkdir -p kept && cd kept")
    # Durations no other process uses prove no process of ours survived, whatever else runs on the
    # host (the local sandbox's processes are the host's; other tests run beside this one).
    first, second = (f"sleep {n}.{random.randrange(10**6):06d}" for n in (100, 101))
    started = time.monotonic()
    result = await shell(ctx, f"sh -c '{first} & {first}'", timeout=2)
    elapsed = time.monotonic() - started
    assert elapsed < 60, elapsed  # the timeout, not `sleep 100`
    assert not result.ok and result.data["timed_out"] and result.data["exit_code"] is None
    assert "timed out after 2 s" in result.output and "still usable" in result.output
    assert await count_processes(sandbox, first) == 0
    await shell(ctx, f"({second} &) ; {second} & echo started; wait", timeout=1)
    assert await count_processes(sandbox, second) == 0
    after = await shell(ctx, "pwd")
    assert after.ok and after.output == "/workspace/kept\n[exit code: 0]"


async def test_no_stdin(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    started = time.monotonic()
    command = 'read -r line; echo "got:[$line]"; cat; python3 -c "input()"'
    result = await shell(ctx, command, timeout=600)
    assert time.monotonic() - started < 120  # nothing waited for input (that would run to the timeout)
    assert result.output.startswith("got:[]\n") and "EOFError" in result.output


async def test_long_output_cut_head_and_tail(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    result = await shell(ctx, "seq 1 20000")
    full = "".join(f"{i}\n" for i in range(1, 20001))
    assert result.ok and result.data["output"] == full
    total = len(full.encode())
    omitted = total - OUTPUT_HEAD_BYTES - OUTPUT_TAIL_BYTES
    assert f"[... {omitted} bytes omitted; the output was {total} bytes in total ...]" in result.output
    assert result.output.startswith("1\n2\n3\n") and result.output.endswith("19999\n20000\n[exit code: 0]")
    assert len(result.output) < OUTPUT_HEAD_BYTES + OUTPUT_TAIL_BYTES + 200


async def test_corrupt_state_replaces_session_and_says_so(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await shell(ctx, "mkdir -p corrupt-dir && cd corrupt-dir && export KEEP=1")
    await sandbox.write_file(await state_file(sandbox, ctx), b"garbage that is not a state file\n")
    pieces: list[str] = []
    result = await shell(dataclasses.replace(ctx, on_output=pieces.append), 'pwd; echo "[$KEEP]"')
    assert "".join(pieces) == "/workspace\n[]\n"  # streamed as it came, without the notice line
    assert result.data["session_reset"]
    assert result.output.startswith("[The shell session's saved state could not be read")
    assert "/workspace\n[]\n[exit code: 0]" in result.output
    again = await shell(ctx, "pwd")
    assert again.output == "/workspace\n[exit code: 0]"  # the new session works and says nothing more


async def test_vanished_directory_falls_back_to_workspace(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await shell(ctx, "mkdir -p doomed && cd doomed")
    await sandbox.exec("rm -rf doomed", cwd="/workspace")
    result = await shell(ctx, "pwd")
    assert result.output == (
        "[The session's working directory no longer exists; this command ran in /workspace.]\n"
        "/workspace\n[exit code: 0]"
    )


async def test_bad_arguments(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    assert "Invalid arguments for tool `shell`" in (await execute("shell", {}, ctx)).output
    negative = await execute("shell", {"command": "true", "timeout": -1}, ctx)
    assert not negative.ok and "`timeout`" in negative.output


async def test_session_state_is_private_and_inside_the_sandbox(sandbox: Sandbox) -> None:
    """The state file holds the exported environment: only its owner may read it, and it lives in
    the sandbox's own temporary folder (the container's tmpfs, or the local sandbox's private
    folder), never in the machine's shared /tmp."""
    ctx = ToolContext(sandbox)
    assert (await shell(ctx, "export TOKENISH=abc")).ok
    path = await state_file(sandbox, ctx)
    mode = await sandbox.exec(f"stat -c %a {path}")
    assert mode.output == "600\n"
    assert "TOKENISH" in (await sandbox.read_file(path)).decode()
    if sandbox.warning is not None:  # local: beside the private copy, removed with it
        assert "/clover-agent-local-" in path and not path.startswith(f"/tmp/{STATE_SUBDIR}")
