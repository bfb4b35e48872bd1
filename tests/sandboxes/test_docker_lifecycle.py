"""No container outlives its run: normal exit, exception, SIGINT, SIGTERM, and (after SIGKILL) the
next start. Each case drives a real child process holding a real container."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import docker
import pytest

from clover_agent.sandboxes.docker import LABEL_OWNER_PID, LABEL_RUN_ID, DockerSandbox, remove_containers
from tests.sandbox_specs import sandbox_spec

from .conftest import start_holder

pytestmark = pytest.mark.docker


def container_exists(container_id: str) -> bool:
    return bool(docker.from_env().api.containers(all=True, filters={"id": container_id}))


async def test_normal_exit_removes_the_container(repo: Path) -> None:
    async with DockerSandbox(sandbox_spec(repo)) as sandbox:
        container_id = sandbox.container_id
        assert container_id and container_exists(container_id)
        labels = docker.from_env().api.inspect_container(container_id)["Config"]["Labels"]
        assert labels["clover-agent"] == "1" and labels[LABEL_RUN_ID] == sandbox.run_id
        assert labels[LABEL_OWNER_PID] == str(os.getpid())
    assert not container_exists(container_id)
    await sandbox.close()  # a second close is harmless


@pytest.mark.usefixtures("own_leftovers")
def test_exception_removes_the_container(repo: Path) -> None:
    child, container_id = start_holder("docker", repo, "raise")
    assert child.wait(timeout=120) == 1
    assert "boom inside the sandbox block" in child.stderr.read()
    assert not container_exists(container_id)


@pytest.mark.usefixtures("own_leftovers")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_removes_the_container(repo: Path, signum: signal.Signals) -> None:
    child, container_id = start_holder("docker", repo)
    assert container_exists(container_id)
    child.send_signal(signum)
    assert child.wait(timeout=120) != 0
    assert not container_exists(container_id)


@pytest.mark.usefixtures("own_leftovers")
async def test_sigkill_leftover_is_reaped_by_the_next_start(repo: Path) -> None:
    child, container_id = start_holder("docker", repo)
    child.kill()
    child.wait(timeout=120)
    assert container_exists(container_id)  # a killed process cannot clean up
    async with DockerSandbox(sandbox_spec(repo)):
        assert not container_exists(container_id)


def exec_events(container_id: str, since: float) -> list[str]:
    """The engine's exec_* events for the container since ``since`` (exec_create, exec_start, ...)."""
    events = docker.from_env().api.events(
        since=int(since), until=int(time.time()) + 1, decode=True, filters={"container": container_id}
    )
    return [e["Action"] for e in events if e.get("Action", "").startswith("exec_")]


async def test_commands_go_through_one_session_not_docker_exec(repo: Path) -> None:
    """Every command, file operation and the diff travel over the runner attached at start; the
    engine's event log shows no `docker exec` for the container."""
    since = time.time() - 1
    async with DockerSandbox(sandbox_spec(repo)) as sandbox:
        assert sandbox.container_id is not None
        for n in range(5):
            assert (await sandbox.exec(f"echo {n}")).output == f"{n}\n"
        await sandbox.write_file("/workspace/one.txt", b"1\n")
        assert await sandbox.read_file("/workspace/one.txt") == b"1\n"
        assert "+1" in await sandbox.diff()
        assert exec_events(sandbox.container_id, since) == []
        # The probe itself sees a real `docker exec`.
        api = docker.from_env().api
        api.exec_start(api.exec_create(sandbox.container_id, "true"))
        assert "exec_die" in exec_events(sandbox.container_id, since)


def test_removals_racing_for_one_container_all_succeed() -> None:
    """Runs sharing an engine reap the same stale container at once: the engine answers all but one
    "removal already in progress" (409), which is not an error."""
    client = docker.from_env()
    container_id = client.api.create_container(
        "clover-agent-sandbox:latest", command=["sleep", "60"], labels={"clover-agent-test": "race"}
    )["Id"]
    client.api.start(container_id)
    results: list[object] = []

    def remove() -> None:
        try:
            results.append(remove_containers(docker.from_env(), [{"Id": container_id}]))
        except Exception as exc:  # the bug: a 409 escaped
            results.append(exc)

    threads = [threading.Thread(target=remove) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not any(isinstance(r, Exception) for r in results), results
    assert sorted(map(len, results)) == [0, 0, 0, 0, 0, 1]  # exactly one of them removed it
    assert not container_exists(container_id)
