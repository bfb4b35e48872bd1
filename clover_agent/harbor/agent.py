"""``CloverAgent``: clover-agent as a Harbor agent (``harbor run -a clover_agent.harbor.agent:CloverAgent``).

Harbor calls :meth:`CloverAgent.setup` and :meth:`CloverAgent.run` in its own process with the task's
environment; everything the agent does to the task happens inside that environment, through
Harbor's ``upload_dir`` and ``exec``: setup puts clover-agent into the container
(:mod:`clover_agent.harbor.install`), and run executes ``clover-agent run --sandbox none`` there in
the task's folder, so the agent's commands stay in the container, and the model is reached from it.
Its ``result.json``, ``patch.diff`` and ``trajectory.jsonl`` land in Harbor's agent log folder.
Why this shape and its limits: docs/harbor.md.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

import clover_agent
from clover_agent.harbor.install import CONTAINER_HOME, InstallError, default_cache, stage

BACKENDS = ("openai", "replay")
#: The running ``clover-agent run``'s process id, so a cancelled run can be stopped (below).
PID_FILE = "/tmp/clover-agent-harbor-run.pid"
#: Ends a run Harbor cancelled (its agent timeout): cancelling the ``exec`` does not end the process
#: in the container, which would go on changing the folder while the tests run. SIGTERM is
#: ``clover-agent run``'s interrupt: it stops the agent's processes and writes ``result.json``.
STOP = f"""pid=$(cat {PID_FILE} 2>/dev/null) || exit 0
kill -TERM "$pid" 2>/dev/null || exit 0
for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.2; done
kill -KILL "$pid" 2>/dev/null
"""
#: ``clover-agent run``'s exit codes that say the run never got to work (usage, the model server
#: out of reach, no sandbox): the trial is an error, not a score of 0.
BROKEN_RUN = {2: "usage", 3: "model backend unavailable", 4: "sandbox unavailable"}
#: Finds the container's Python (>= 3.11: clover-agent's floor), its machine, and git, which
#: ``--sandbox none`` needs to record the folder's starting state.
PROBE = """python=$(command -v {python}) || {{ echo "no {python} on PATH"; exit 3; }}
command -v git >/dev/null || {{ echo "no git on PATH"; exit 3; }}
"$python" -c 'import platform, sys
if sys.version_info < (3, 11): sys.exit("Python %d.%d, not >= 3.11" % sys.version_info[:2])
print(sys.executable, "%d.%d" % sys.version_info[:2], platform.machine())'
"""


class CloverAgentError(RuntimeError):
    """The task's container cannot run clover-agent, or ``clover-agent run`` did not get to work."""


class CloverAgent(BaseAgent):
    """Options (``harbor run --ak NAME=VALUE``): ``backend`` (``openai``, the default, or
    ``replay``); ``server_url`` (the OpenAI-compatible ``/v1`` URL of ``clover-agent serve``, as
    the container reaches it; its key from ``CLOVER_API_KEY`` in ``--ae`` or Harbor's environment);
    ``replay`` (a JSON Lines file on Harbor's machine, for tests and demos: never a model);
    ``max_steps`` (100), ``max_time`` (seconds; none: Harbor's task timeout decides), ``workdir``
    (the task's folder; default: the container's working directory), ``python`` (``python3``).
    ``-m NAME`` is sent to the server as the model name."""

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        *,
        backend: str = "openai",
        server_url: str | None = None,
        replay: str | None = None,
        max_steps: int = 100,
        max_time: float | None = None,
        workdir: str | None = None,
        python: str = "python3",
        **kwargs: Any,
    ) -> None:
        super().__init__(logs_dir, model_name, **kwargs)
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
        if backend == "openai" and not server_url:
            raise ValueError(
                "backend=openai needs server_url=http://HOST:PORT/v1 (as the container reaches it)"
            )
        if backend == "replay" and not (replay and Path(replay).is_file()):
            raise ValueError(f"backend=replay needs replay=FILE, a file on this machine ({replay!r} is not)")
        self.backend, self.server_url, self.replay = backend, server_url, replay
        self.max_steps, self.max_time = int(max_steps), (float(max_time) if max_time else None)
        self.workdir, self.python = workdir, python

    @staticmethod
    def name() -> str:
        return "clover-agent"

    def version(self) -> str | None:
        return clover_agent.__version__

    async def setup(self, environment: BaseEnvironment) -> None:
        """Put clover-agent into the container at ``/opt/clover-agent``, for its Python and machine."""
        probe = await environment.exec(PROBE.format(python=shlex.quote(self.python)), user="root")
        found = (probe.stdout or "").strip().splitlines()
        if probe.return_code != 0 or not found:
            why = ((probe.stdout or "") + (probe.stderr or "")).strip()[-500:]
            raise CloverAgentError(f"the task's container cannot run clover-agent: {why}")
        python_path, version, machine = found[-1].rsplit(" ", 2)
        with tempfile.TemporaryDirectory(prefix="clover-harbor-") as folder:
            try:
                staged = await asyncio.to_thread(
                    stage, version, python_path, machine, default_cache(), Path(folder) / "home"
                )
            except InstallError as exc:
                raise CloverAgentError(str(exc)) from exc
            await environment.upload_dir(staged, CONTAINER_HOME)
        if self.replay:
            await environment.upload_file(self.replay, f"{CONTAINER_HOME}/replay.jsonl")
        check = await environment.exec(f"{CONTAINER_HOME}/bin/clover-agent --version", user="root")
        if check.return_code != 0:
            raise CloverAgentError(
                f"clover-agent does not start in the container: {check.stdout}{check.stderr}"
            )

    def command(self, instruction: str, workdir: str) -> str:
        """The ``clover-agent run`` command line for the container (its process id kept)."""
        out = PurePosixPath(self.environment_logs_dir) / "clover"
        args = [
            f"{CONTAINER_HOME}/bin/clover-agent", "run", instruction, "--dir", workdir, "--sandbox", "none",
            "--out", str(out), "--backend", self.backend, "--max-steps", str(self.max_steps),
        ]  # fmt: skip
        if self.backend == "replay":
            args += ["--replay", f"{CONTAINER_HOME}/replay.jsonl"]
        else:
            args += ["--base-url", str(self.server_url)]
            args += ["--model-name", self.model_name] if self.model_name else []
        if self.max_time:
            args += ["--max-time", str(self.max_time)]
        return f"echo $$ > {PID_FILE} && exec {shlex.join(args)}"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        """Run clover-agent once in the task's folder; its files go to ``logs_dir/clover``."""
        workdir = self.workdir or ((await environment.exec("pwd")).stdout or "").strip() or "/"
        key = self._get_env("CLOVER_API_KEY")  # --ae, else Harbor's own environment
        try:
            done = await environment.exec(
                self.command(instruction, workdir), cwd=workdir, env={"CLOVER_API_KEY": key} if key else None
            )
        except asyncio.CancelledError:
            await environment.exec(STOP, user="root", timeout_sec=60)
            await self._result(environment)
            raise
        (self.logs_dir / "clover-run.txt").write_text(f"{done.stdout or ''}{done.stderr or ''}")
        result = await self._result(environment)
        context.metadata = {"clover_exit_code": done.return_code, "clover_result": result}
        if done.return_code in BROKEN_RUN:
            tail = ((done.stdout or "") + (done.stderr or "")).strip()[-1000:]
            raise CloverAgentError(f"clover-agent run: {BROKEN_RUN[done.return_code]}: {tail}")

    async def _result(self, environment: BaseEnvironment) -> dict[str, Any] | None:
        """``result.json`` as written in the container (downloaded when the log folder is not shared)."""
        local = self.logs_dir / "clover"
        if not (local / "result.json").is_file():
            try:
                await environment.download_dir(
                    str(PurePosixPath(self.environment_logs_dir) / "clover"), local
                )
            except Exception as exc:  # whatever the environment's transfer raises: the run is judged anyway
                self.logger.warning("clover-agent's output could not be read back: %s", exc)
        try:
            loaded = json.loads((local / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None
