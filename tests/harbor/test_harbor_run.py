"""A real Harbor run (the ``harbor`` package from the index, its local Docker environment, Docker
Compose) of a task built here from the local base image, judged by the task's own ``TASK/tests/test.sh``:
clover-agent's agent class with a replayed model that fixes the task gets reward 1; Harbor's own
no-op agent, and clover-agent's agent whose replay only claims to be done, get 0.

Harbor needs Python >= 3.12: ``scripts/harbor-env`` makes its environment once (cached; ``.ci/run``
makes it first). The replay is recorded turns, not a model; everything else is real.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clover_agent.sandboxes.images import DEFAULT_BASE_IMAGE
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.clover_agent.test_backend_openai import ChatServer, _chunk

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow, pytest.mark.xdist_group("harbor")]

TASK = "clover-harbor-calc"
MARKER = f"/tmp/clover-harbor-marker-{os.getpid()}"
FIX = [
    call(
        "shell", command=f"touch {MARKER} && cd /workspace && python3 -c 'import calc; print(calc.add(2, 3))'"
    ),
    call("editor", command="str_replace", path="/workspace/calc.py", old_str="a - b", new_str="a + b"),
    call("finish", summary="add() subtracted; it adds now."),
]
CLAIM_ONLY = [call("finish", summary="Fixed add().")]
#: The task's text is the task author's, not ours: it reaches the agent as written, never a shell.
INSTRUCTION = "`add` in /app/calc.py gives wrong sums: make add(2, 3) return 5. $(touch /app/pwned) `id`'\n"


@pytest.fixture(scope="module")
def harbor_env() -> Path:
    """The environment with Harbor (made by scripts/harbor-env, which says why when it cannot)."""
    made = subprocess.run(
        [str(REPO / "scripts" / "harbor-env")], capture_output=True, text=True, timeout=1500, check=False
    )
    if made.returncode == 2 and os.environ.get("CLOVER_REQUIRE_DOCKER") != "1":
        pytest.skip(made.stderr.strip())
    assert made.returncode == 0, made.stdout + made.stderr
    return Path(made.stdout.strip().splitlines()[-1])


def make_task(root: Path, image_steps: str = "", agent_timeout: float = 300.0, agent_user: str = "") -> Path:
    """A Terminal-Bench-shaped task: a bug in calc.py in /app, a reward from the task's own check;
    ``image_steps``: more Dockerfile lines; ``agent_timeout``: Harbor's limit on the agent's run;
    ``agent_user``: whom Harbor runs the agent as (default: the image's user, root)."""
    task = root / TASK
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(INSTRUCTION)
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 120.0\n\n[agent]\ntimeout_sec = {agent_timeout}\n'
        + (f'user = "{agent_user}"\n' if agent_user else "")
        + "\n[environment]\nbuild_timeout_sec = 300.0\n"
    )
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {DEFAULT_BASE_IMAGE}\nWORKDIR /app\nRUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py\n"
        + image_steps
    )
    test = task / "tests" / "test.sh"
    test.write_text(
        "#!/bin/bash\ncd /app\n"
        "if python3 -c 'import calc, sys; sys.exit(calc.add(2, 3) != 5 or calc.add(-1, 1) != 0)'; then\n"
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    )
    test.chmod(0o755)
    return task


def harbor_run(env: Path, tmp_path: Path, job: str, *agent: str, **task: Any) -> dict:
    """``harbor run`` of the task with ``agent``'s options; the one trial's result.json."""
    (result,) = harbor_trials(env, tmp_path, job, *agent, **task)
    return result


def harbor_trials(
    env: Path,
    tmp_path: Path,
    job: str,
    *agent: str,
    attempts: int = 1,
    cache: Path | None = None,
    **task: Any,
) -> list[dict]:
    """``harbor run`` of the task ``attempts`` times at once; each trial's result.json.
    ``cache``: where the agent class keeps the container's libraries (default: beside Harbor)."""
    jobs = tmp_path / "jobs"
    environ = {
        **os.environ,
        "HARBOR_TELEMETRY": "0",
        "CLOVER_HARBOR_CACHE": str(cache or env / "clover-cache"),
    }
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        environ["DOCKER_CONFIG"] = str(env / "docker-config")  # the Compose plugin from the wheel
    ran = subprocess.run(
        [str(env / "bin" / "harbor"), "run", "-p", str(make_task(tmp_path / job, **task)), "-o", str(jobs),
         "--job-name", job, "-n", str(attempts), "-k", str(attempts), "-q", *agent],
        capture_output=True, text=True, timeout=900, env=environ, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = []
    for trial in sorted(p for p in (jobs / job).iterdir() if p.is_dir()):
        results.append({**json.loads((trial / "result.json").read_text()), "_trial": str(trial)})
    assert len(results) == attempts
    return results


def reward(result: dict) -> float:
    assert result["exception_info"] is None, result["exception_info"]
    return result["verifier_result"]["rewards"]["reward"]


CLOVER = ["-a", "clover_agent.harbor.agent:CloverAgent", "-m", "clover", "--ak", "backend=replay"]


def test_clover_agent_with_a_replayed_fix_passes_the_task(harbor_env: Path, tmp_path: Path) -> None:
    replay = write_replay(tmp_path / "fix.jsonl", FIX)
    result = harbor_run(harbor_env, tmp_path, "fix", *CLOVER, "--ak", f"replay={replay}")

    assert reward(result) == 1.0
    out = Path(result["_trial"]) / "agent" / "clover"  # clover-agent run's files, from the container
    ran = json.loads((out / "result.json").read_text())
    assert ran["outcome"] == "submitted" and ran["sandbox"] == "none" and ran["dir"] == "/app"
    assert ran["files"] == ["calc.py"] and ran["claim"] == "add() subtracted; it adds now."  # no pwned
    patch = (out / "patch.diff").read_text()
    assert "-    return a - b" in patch and "+    return a + b" in patch
    # the agent's command ran in the task's container: it saw the bug there, and left nothing here
    events = [json.loads(line) for line in (out / "trajectory.jsonl").read_text().splitlines()]
    (shell,) = [e for e in events if e["type"] == "tool_call_finished" and e["name"] == "shell"]
    assert "-1" in shell["output"] and not shell["is_error"]
    assert not Path(MARKER).exists()
    (started,) = [e for e in events if e["type"] == "run_started"]
    assert INSTRUCTION.strip() in started["task"]  # as the task wrote it
    assert result["agent_result"]["metadata"]["clover_exit_code"] == 0


def test_harbors_no_op_agent_fails_the_task(harbor_env: Path, tmp_path: Path) -> None:
    assert reward(harbor_run(harbor_env, tmp_path, "nop", "-a", "nop")) == 0.0


def test_a_claim_without_a_change_fails_the_task(harbor_env: Path, tmp_path: Path) -> None:
    replay = write_replay(tmp_path / "claim.jsonl", CLAIM_ONLY)
    result = harbor_run(harbor_env, tmp_path, "claim", *CLOVER, "--ak", f"replay={replay}")

    assert reward(result) == 0.0  # the task's test judges, not the agent's summary
    ran = result["agent_result"]["metadata"]["clover_result"]
    assert ran["outcome"] == "submitted" and ran["files"] == []


def docker_gateway() -> str:
    """This machine's address on Docker's default bridge: how a task's container reaches it. The
    network's IPAM entry names it on most engines; Debian's 20.10 leaves the gateway out there (only
    the subnet), and then it is the subnet's first address, as Docker assigns it to the bridge."""
    inspect = ["docker", "network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}"]
    config = json.loads(subprocess.run(inspect, capture_output=True, text=True, check=True).stdout)[0]
    gateway = config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    assert gateway, config
    return gateway


def test_the_model_server_is_reached_from_the_container_with_its_key(
    harbor_env: Path, tmp_path: Path
) -> None:
    """``backend=openai``: an OpenAI-compatible server (scripted replies) at ``server_url`` as the
    container reaches it; the key goes to the server and nowhere else."""
    server = ChatServer(host=docker_gateway())
    key = "sk-harbor-never-shown-0123456789"
    try:
        server.models = ["clover"]
        turns = [FIX[0], call("shell", command="env"), *FIX[1:]]
        server.replies.extend(
            {"sse": [_chunk({"content": t}), _chunk({}, finish="stop"), "[DONE]"]} for t in turns
        )
        result = harbor_run(
            harbor_env, tmp_path, "server",
            "-a", "clover_agent.harbor.agent:CloverAgent", "-m", "clover",
            "--ak", f"server_url={server.base_url}", "--ae", f"CLOVER_API_KEY={key}",
        )  # fmt: skip
    finally:
        server.close()

    assert reward(result) == 1.0
    posts = [r for r in server.requests if r["body"] is not None]
    assert len(posts) == 4
    assert all(
        r["headers"]["Authorization"] == f"Bearer {key}" and r["body"]["model"] == "clover" for r in posts
    )
    agent_logs = Path(result["_trial"]) / "agent"
    written = "".join(p.read_text() for p in agent_logs.rglob("*") if p.is_file())
    assert "HOSTNAME=" in written and key not in written  # `env` ran; the key never reached a command


def test_a_container_without_git_is_an_error_that_says_so(harbor_env: Path, tmp_path: Path) -> None:
    replay = write_replay(tmp_path / "fix.jsonl", FIX)
    result = harbor_run(
        harbor_env,
        tmp_path,
        "nogit",
        *CLOVER,
        "--ak",
        f"replay={replay}",
        image_steps="RUN rm /usr/bin/git\n",
    )

    error = result["exception_info"]
    assert error["exception_type"] == "CloverAgentError"
    assert "cannot run clover-agent: no git on PATH" in error["exception_message"]


def test_harbors_timeout_stops_the_run_in_the_container(harbor_env: Path, tmp_path: Path) -> None:
    """Harbor's agent timeout cancels the ``exec``; the run inside the container is ended too (as an
    interrupt: its result written, its processes stopped), not left changing the folder while the
    task's tests run."""
    late = "sleep 60; cd /workspace && sed -i 's/a - b/a + b/' calc.py"  # a fix that comes too late
    replay = write_replay(tmp_path / "slow.jsonl", [call("shell", command=late, timeout=600)])
    result = harbor_run(harbor_env, tmp_path, "slow", *CLOVER, "--ak", f"replay={replay}", agent_timeout=15.0)

    assert result["exception_info"]["exception_type"] == "AgentTimeoutError"
    assert result["verifier_result"]["rewards"]["reward"] == 0.0  # the late fix never landed
    ran = json.loads((Path(result["_trial"]) / "agent" / "clover" / "result.json").read_text())
    assert ran["outcome"] == "interrupted" and ran["files"] == []


def test_a_task_that_runs_its_agent_as_another_user(harbor_env: Path, tmp_path: Path) -> None:
    """``[agent] user``: clover-agent is put in place as root and runs as the task's user."""
    turns = [call("shell", command="id -un"), *FIX[1:]]
    replay = write_replay(tmp_path / "user.jsonl", turns)
    result = harbor_run(
        harbor_env, tmp_path, "user", *CLOVER, "--ak", f"replay={replay}",
        image_steps="RUN useradd --create-home player && chown -R player /app\n", agent_user="player",
    )  # fmt: skip

    assert reward(result) == 1.0
    events = (Path(result["_trial"]) / "agent" / "clover" / "trajectory.jsonl").read_text().splitlines()
    (shell,) = [
        e for e in map(json.loads, events) if e["type"] == "tool_call_finished" and e["name"] == "shell"
    ]
    assert shell["output"].startswith("player")


def test_trials_set_up_at_once_share_one_fresh_library_folder(harbor_env: Path, tmp_path: Path) -> None:
    """Two trials at once with no cached libraries: both fetch-or-wait for the one folder (pip, from
    the package index, for the container's Python), neither breaks the other's, and it is kept."""
    replay = write_replay(tmp_path / "fix.jsonl", FIX)
    cache = tmp_path / "cache"
    results = harbor_trials(
        harbor_env, tmp_path, "pair", *CLOVER, "--ak", f"replay={replay}", attempts=2, cache=cache
    )

    assert [reward(r) for r in results] == [1.0, 1.0]
    (folder,) = cache.iterdir()  # one folder, no partial one left
    assert folder.name.startswith("libs-py3.11-") and (folder / "jsonschema").is_dir()
