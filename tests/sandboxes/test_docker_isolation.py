"""The Docker sandbox's isolation, checked from inside real containers. Sends no network traffic:
the network checks only read the interface table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from clover_agent.sandboxes.base import SandboxLimits
from clover_agent.sandboxes.docker import DockerSandbox
from clover_agent.sandboxes.errors import SandboxError
from tests.sandbox_specs import sandbox_spec

pytestmark = pytest.mark.docker


@pytest.fixture
async def small(repo: Path) -> AsyncIterator[DockerSandbox]:
    """A sandbox with small limits: 64 MiB of memory, 64 processes."""
    spec = sandbox_spec(repo, limits=SandboxLimits(cpus=1.0, memory_bytes=64 * 1024**2, pids=64))
    async with DockerSandbox(spec) as sandbox:
        yield sandbox


def interfaces(proc_net_dev: str) -> list[str]:
    return [line.split(":", 1)[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line]


async def test_only_loopback_non_root_no_capabilities(small: DockerSandbox) -> None:
    assert interfaces((await small.exec("cat /proc/net/dev")).output) == ["lo"]
    assert (await small.exec("id -u; id -g")).output == "1000\n1000\n"
    status = (await small.read_file("/proc/self/status")).decode()
    caps = {
        k: v.strip()
        for k, v in (line.split(":", 1) for line in status.splitlines() if line.startswith("Cap"))
    }
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0 and int(caps["CapBnd"], 16) == 0
    assert "NoNewPrivs:\t1" in status
    assert (await small.exec("echo $HOME")).output == "/tmp\n"


async def test_writes_outside_workspace_and_tmp_fail(small: DockerSandbox) -> None:
    for path in ("/etc/evil", "/usr/local/bin/evil", "/evil", "/home/agent/evil", "/var/tmp/evil"):
        result = await small.exec(f"echo x > {path}")
        assert result.exit_code != 0, path
        assert "Read-only file system" in result.output or "Permission denied" in result.output
    with pytest.raises(OSError):
        await small.write_file("/etc/evil", b"x")
    ok = await small.exec("echo a > /workspace/fine && echo b > /tmp/fine && cat /workspace/fine /tmp/fine")
    assert ok.exit_code == 0 and ok.output == "a\nb\n"


async def test_memory_hog_is_killed_and_reported(small: DockerSandbox) -> None:
    result = await small.exec("python3 -c \"b = b'x' * (256 << 20); print('survived')\"", timeout=60)
    assert result.oom_killed and result.exit_code == 137
    assert "out of memory" in (result.killed_reason or "")
    assert "survived" not in result.output
    assert (await small.exec("echo alive")).output == "alive\n"  # the sandbox itself lives on
    child = await small.exec("python3 -c \"b = b'x' * (256 << 20)\"; echo the shell lived on", timeout=60)
    assert child.exit_code == 0 and child.output.endswith("the shell lived on\n")
    assert child.oom_killed and child.killed_reason == (
        "out of memory: a process it started was killed at the sandbox's memory limit"
    )


async def test_fork_storm_stops_at_the_pid_limit(small: DockerSandbox) -> None:
    result = await small.exec(":(){ :|:& };: ; sleep 2", timeout=600)
    assert result.pid_limit_hit and "process limit" in (result.killed_reason or "")
    assert not result.timed_out  # the limit stopped the storm, not the timeout
    after = await small.exec("ps -e --no-headers | wc -l")
    assert after.exit_code == 0 and int(after.output) < 10  # the storm is gone, the sandbox usable


async def test_cpu_limit_is_applied(repo: Path) -> None:
    spec = sandbox_spec(repo, limits=SandboxLimits(cpus=0.5, memory_bytes=128 * 1024**2, pids=32))
    async with DockerSandbox(spec) as sandbox:
        attrs = docker.from_env().api.inspect_container(sandbox.container_id)["HostConfig"]
        assert attrs["NanoCpus"] == 500_000_000
        assert attrs["Memory"] == 128 * 1024**2 and attrs["PidsLimit"] == 32
        assert attrs["ReadonlyRootfs"] and attrs["CapDrop"] == ["ALL"]
        assert attrs["NetworkMode"] == "none" and "no-new-privileges" in attrs["SecurityOpt"]


async def test_setup_commands_get_the_network_then_lose_it(repo: Path) -> None:
    spec = sandbox_spec(
        repo,
        setup_commands=["cat /proc/net/dev > /workspace/setup-net.txt", "echo built > build.out"],
        setup_network=True,
    )
    async with DockerSandbox(spec) as sandbox:
        during = interfaces((await sandbox.read_file("/workspace/setup-net.txt")).decode())
        assert "lo" in during and len(during) > 1  # a real interface while setting up
        assert interfaces((await sandbox.exec("cat /proc/net/dev")).output) == ["lo"]
        # What set-up made is part of the starting state, not of the agent's diff.
        assert await sandbox.diff() == ""


async def test_a_dead_runner_is_reported_not_hung(small: DockerSandbox) -> None:
    """If the container's main process dies (here: killed from inside), requests fail at once with
    the container's state instead of waiting forever."""
    with pytest.raises(SandboxError, match=r"sandbox container stopped .*exit code 137"):
        await small.exec("kill -9 $PPID; sleep 30", timeout=60)
    with pytest.raises(SandboxError):
        await small.exec("true")


FILL_PROCESS_TABLE = """
import os, time
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()  # leave the command's process group, so the filler outlives the command
    told = False
    while True:  # take every process slot, and every slot freed later
        try:
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
        except BlockingIOError:
            if not told:
                os.write(ready_w, b"x")
                told = True
            time.sleep(0.001)
os.read(ready_r, 1)
"""


async def test_no_process_slot_left_is_reported(small: DockerSandbox) -> None:
    await small.write_file("/tmp/fill.py", FILL_PROCESS_TABLE.encode())
    filled = await small.exec("python3 /tmp/fill.py", timeout=300)
    assert filled.exit_code == 0 and filled.pid_limit_hit
    # The filler takes back the slots its parent and the runner's thread freed: until it has, a
    # command may still start (and, while the filler hits the limit beside it, run with
    # pid_limit_hit set): wait for one that could not start.
    deadline = time.monotonic() + 120
    while (result := await small.exec("echo hi")).exit_code is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert result.exit_code is None and result.pid_limit_hit
    assert result.killed_reason == "process limit reached: the command could not start"
