"""Behaviour every sandbox kind shares: the workspace copy, commands, files, and the diff."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clover_agent.sandboxes.base import Sandbox

from .conftest import tree_snapshot


async def test_workspace_is_a_copy_of_the_current_state(sandbox: Sandbox) -> None:
    assert (await sandbox.read_file("/workspace/README.md")) == b"# demo\n\nuncommitted line\n"
    assert (await sandbox.read_file("/workspace/notes.txt")) == b"untracked\n"
    assert await sandbox.stat("/workspace/ignored.log") is None
    log = await sandbox.exec("git log --format=%s", cwd="/workspace")
    assert log.output.splitlines() == ["clover-agent: starting state", "second", "first"]
    status = await sandbox.exec("git status --porcelain")
    assert status.exit_code == 0 and status.output == ""
    mode = await sandbox.exec("test -x run.sh && ./run.sh")
    assert mode.output == "run\n"


async def process_state(sandbox: Sandbox, pid_file: str) -> str:
    """The state letter of the process whose pid is in ``pid_file`` ("Z": a dead zombie), or "gone"."""
    result = await sandbox.exec(f"cut -d' ' -f3 /proc/$(cat {pid_file})/stat 2>/dev/null || echo gone")
    return result.output.strip()


async def test_exec_output_exit_code_env_and_cwd(sandbox: Sandbox) -> None:
    result = await sandbox.exec("echo out; echo err >&2; echo out2; exit 3")
    assert result.exit_code == 3 and not result.timed_out
    assert result.output == "out\nerr\nout2\n"
    assert (await sandbox.exec("pwd", cwd="/workspace/src")).output == "/workspace/src\n"
    assert (await sandbox.exec("cd /workspace/src && pwd")).output == "/workspace/src\n"
    assert (await sandbox.exec("echo $GREETING", env={"GREETING": "hello"})).output == "hello\n"
    assert (await sandbox.exec("read line; echo got:$line")).output == "got:\n"  # stdin is closed
    missing = await sandbox.exec("no-such-command-xyz")
    assert missing.exit_code == 127 and "not found" in missing.output
    with pytest.raises(FileNotFoundError):
        await sandbox.exec("true", cwd="/workspace/no/such/dir")


async def test_timeout_kills_the_whole_process_group(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = await sandbox.exec("(sleep 1000; echo late) & echo $! > bg.pid; sleep 1000", timeout=3)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None
    assert "timeout after 3" in (result.killed_reason or "")
    # It waited for the timeout, not for `sleep 1000` (or its background child) to end.
    assert 3 <= elapsed < 120
    # The background child died with the command: its pid no longer exists.
    assert await process_state(sandbox, "bg.pid") in ("gone", "Z")
    assert (await sandbox.exec("echo still usable")).output == "still usable\n"


async def test_background_jobs_do_not_outlive_their_command(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = await sandbox.exec("sleep 100 & echo $! > bg2.pid; echo started")
    assert result.exit_code == 0 and result.output == "started\n"
    assert time.monotonic() - started < 60  # it did not wait for `sleep 100`
    assert await process_state(sandbox, "bg2.pid") in ("gone", "Z")


async def test_file_operations(sandbox: Sandbox) -> None:
    await sandbox.write_file("/workspace/pkg/new_module.py", b"X = 1\n")
    assert await sandbox.read_file("pkg/new_module.py") == b"X = 1\n"
    entry = await sandbox.stat("/workspace/pkg")
    assert entry is not None and entry.is_dir and entry.path == "/workspace/pkg"
    await sandbox.write_file("/workspace/run.sh", b"#!/bin/sh\necho changed\n")
    assert (await sandbox.exec("./run.sh")).output == "changed\n"  # the mode was kept
    listed = [e.path for e in await sandbox.list_files("/workspace", max_depth=1)]
    assert "/workspace/src" in listed and "/workspace/src/calc.py" not in listed
    deep = {e.path: e for e in await sandbox.list_files("/workspace")}
    assert deep["/workspace/src/calc.py"].size == len(b"def add(a, b):\n    return a - b\n")
    assert not any(p.startswith("/workspace/.git/") for p in deep)
    await sandbox.exec("ln -s src/calc.py link.py")
    assert await sandbox.realpath("/workspace/link.py") == "/workspace/src/calc.py"
    assert await sandbox.realpath("/workspace/src/../missing/file") == "/workspace/missing/file"
    assert (await sandbox.stat("/workspace/link.py")).is_symlink
    with pytest.raises(FileNotFoundError) as excinfo:
        await sandbox.read_file("/workspace/does/not/exist.txt")
    assert excinfo.value.filename == "/workspace/does/not/exist.txt"
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("/workspace/src")
    with pytest.raises(NotADirectoryError):
        await sandbox.list_files("/workspace/README.md")


async def test_write_replaces_atomically_through_links(sandbox: Sandbox) -> None:
    await sandbox.exec("ln -s src/calc.py link.py")
    await sandbox.write_file("/workspace/link.py", b"Z = 3\n")
    assert (await sandbox.stat("/workspace/link.py")).is_symlink  # the link is still a link
    assert await sandbox.read_file("/workspace/src/calc.py") == b"Z = 3\n"
    with pytest.raises(IsADirectoryError):
        await sandbox.write_file("/workspace/src", b"not a folder\n")
    leftovers = await sandbox.exec("find . -name '.clover-write-*' -not -path './.git/*'")
    assert leftovers.exit_code == 0 and leftovers.output == ""  # the failed write's temporary file is gone
    assert (await sandbox.stat("/workspace/src")).is_dir


async def test_diff_shows_only_the_agents_changes(sandbox: Sandbox) -> None:
    assert await sandbox.diff() == ""
    await sandbox.write_file("/workspace/src/calc.py", b"def add(a, b):\n    return a + b\n")
    await sandbox.write_file("/workspace/src/extra.py", b"Y = 2\n")
    await sandbox.exec("rm notes.txt && git add src/extra.py")
    patch = await sandbox.diff()
    assert "-    return a - b\n+    return a + b\n" in patch
    assert "new file mode 100644" in patch and "+Y = 2" in patch
    assert "deleted file mode" in patch and "-untracked" in patch
    assert "uncommitted line" not in patch  # the user's own changes are part of the baseline
    # The diff does not disturb the agent's index.
    staged = await sandbox.exec("git diff --cached --name-only")
    assert staged.output == "src/extra.py\n"


async def test_nothing_reaches_the_users_tree(sandbox: Sandbox, repo: Path) -> None:
    before = tree_snapshot(repo)
    await sandbox.write_file("/workspace/README.md", b"overwritten\n")
    await sandbox.exec(
        "echo x > created.txt; rm -f notes.txt; git commit -qam agent; git branch agent-branch"
    )
    assert tree_snapshot(repo) == before  # every kind works on a copy
    if sandbox.warning is None:  # only the isolated sandbox keeps the user's tree out of reach
        await sandbox.exec(f"touch {repo}/escaped.txt 2>/dev/null; true")
        assert tree_snapshot(repo) == before
