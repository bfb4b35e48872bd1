"""``LocalSandbox``: the sandbox interface over a private copy of the repository on this machine.

Opt-in (``--sandbox local``) for machines without Docker. It does NOT isolate: commands run as the
user, with the user's network, environment and file permissions. Only the repository is protected:
the agent works on a copy in a temporary folder, removed on close. How ``/workspace`` maps to the
copy, the environment commands get and the disk limit are in sandboxes/README.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from clover_agent.sandboxes import cleanup
from clover_agent.sandboxes.base import WORKSPACE, Attached, ExecResult, OutputSink, SandboxSpec, require_repo
from clover_agent.sandboxes.errors import SandboxError
from clover_agent.sandboxes.session import RunnerSession, SessionSandbox, runner_command
from clover_agent.sandboxes.workspace import copy_workspace, plan_workspace

log = logging.getLogger(__name__)

LOCAL_WARNING = (
    "local sandbox (no isolation): commands run directly on this machine as you, with your network and "
    "permissions; only the repository is protected (the agent works on a private copy)"
)
_COPY_PREFIX = "clover-agent-local-"
#: ``/workspace`` as a whole path word: not part of ``/x/workspace`` or ``/workspaces``.
_WORKSPACE_WORD = re.compile(r"(?<![\w.-])/workspace(?![\w.-])")


class LocalSandbox(SessionSandbox):
    warning = LOCAL_WARNING

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.host_workspace: Path | None = None  # the copy's real path, once started
        self._folder: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._cleanup_token: int | None = None

    async def start(self) -> None:
        log.warning(LOCAL_WARNING)
        spec = self.spec
        require_repo(spec)
        await asyncio.to_thread(reap_stale_copies)
        self._folder = Path(tempfile.mkdtemp(prefix=f"{_COPY_PREFIX}{os.getpid()}-")).resolve()
        self._cleanup_token = cleanup.register(self._close_now)
        workspace = self._folder / "workspace"
        workspace.mkdir()
        private_tmp = self._folder / "tmp"
        private_tmp.mkdir(mode=0o700)
        self.host_workspace = workspace
        try:
            plan = await asyncio.to_thread(plan_workspace, spec.repo)
            plan.check_size(spec.limits.disk_bytes)
            await asyncio.to_thread(copy_workspace, plan, workspace)
            await self._start_runner(workspace, private_tmp)
            await self._record_baseline(plan.keep_out)
        except BaseException:
            await self.close()
            raise

    async def _start_runner(self, workspace: Path, private_tmp: Path) -> None:
        """Start the runner in ``workspace`` (commands' ``TMPDIR``: ``private_tmp``), then the spec's
        set-up commands."""
        spec = self.spec
        env = {**spec.host_env, **spec.env, "WORKSPACE": str(workspace), "TMPDIR": str(private_tmp)}
        self._proc = subprocess.Popen(
            runner_command(sys.executable, str(workspace), "local"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal reaches the agent, not the runner
        )
        _cap_file_size(self._proc.pid, spec.limits.disk_bytes)
        session = RunnerSession(self._send)
        for stream, sink in ((self._proc.stdout, session.feed), (self._proc.stderr, session.feed_stderr)):
            threading.Thread(target=_pump, args=(stream, sink, session), daemon=True).start()
        await asyncio.to_thread(session.start)
        self._session = session
        await self._run_setup_commands(spec.setup_commands, spec.setup_timeout)

    def _send(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        on_output: OutputSink | None = None,
    ) -> ExecResult:
        host = str(self.host_workspace)
        command = _WORKSPACE_WORD.sub(lambda _: host, command)
        if env:
            env = {name: _WORKSPACE_WORD.sub(lambda _: host, value) for name, value in env.items()}
        sink = on_output
        if on_output is not None:  # pieces say /workspace too (a path cut between two stays as it is)
            sink = lambda piece: on_output(piece.replace(host, WORKSPACE))  # noqa: E731
        result = await super().exec(command, timeout=timeout, env=env, cwd=cwd, on_output=sink)
        result.output = result.output.replace(host, WORKSPACE)
        return result

    def attached(self, argv: list[str], env: dict[str, str] | None = None) -> Attached:
        """``argv`` on this machine in the copy, with the environment the sandbox's commands get."""
        if self.host_workspace is None or self._folder is None:
            raise SandboxError("the local sandbox is not started")
        host = str(self.host_workspace)
        extra = {name: _WORKSPACE_WORD.sub(lambda _: host, value) for name, value in (env or {}).items()}
        base = {**self.spec.host_env, **self.spec.env, "WORKSPACE": host, "TMPDIR": str(self._folder / "tmp")}
        return Attached([_WORKSPACE_WORD.sub(lambda _: host, a) for a in argv], host, {**base, **extra})

    async def close(self) -> None:
        await asyncio.to_thread(self._close_now)

    def _close_now(self) -> None:
        """Stop the runner (it kills what it still runs) and delete the copy. Idempotent."""
        self._session = None
        self.base_commit = None
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if self._cleanup_token is not None:
            cleanup.unregister(self._cleanup_token)
            self._cleanup_token = None
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _cap_file_size(pid: int, limit: int) -> None:
    """Cap every file the runner and its commands write at ``limit`` bytes (set before the runner
    has read its source, so before any command; never raising a lower cap already in place)."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (cap, hard))


def _pump(stream, sink, session: RunnerSession) -> None:
    """Reader thread: copy a runner pipe into the session until it closes."""
    while chunk := stream.read1(65536):
        sink(chunk)
    if sink == session.feed:
        session.feed_eof()


def reap_stale_copies(prefix: str = _COPY_PREFIX) -> list[Path]:
    """Delete local-sandbox copies (or the temporary folders named ``prefix``PID-...) left by
    processes that no longer exist; return what was removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid_text = folder.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and not cleanup.owner_alive(int(pid_text), None):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
