"""One agent session, opened and closed the same way by every front end.

:class:`AgentSession` is the only place an agent is assembled: the sandbox (started, closed again
if its start fails) and the user's hooks (:class:`~clover_agent.hooks.Hooks`, run by the agent and
the hand-back), then the MCP servers in it, the policy with their tools, the
:class:`~clover_agent.agent.loop.Agent` with the default tools and theirs (the SessionStart hooks
run), and the system prompt from the sandbox's facts; :meth:`AgentSession.close` takes them down in
reverse (the SessionEnd hooks first). ``fix`` (and so
the CI bot and ``eval``), the TUI and ACP all open their sessions here
(tests/test_architecture.py checks that no other module builds an agent or starts MCP servers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.agent.approvals import Approvals
from clover_agent.agent.budget import Budget
from clover_agent.agent.loop import Agent
from clover_agent.agent.policy import DEFAULT_PRESET, Policy, preset, with_mcp
from clover_agent.agent.records import RecordKey
from clover_agent.agent.system_prompt import gather_facts, system_prompt
from clover_agent.agent.trajectory import TRAJECTORY_FILE
from clover_agent.backends.base import ModelBackend
from clover_agent.errors import RUN_ERRORS
from clover_agent.events import EventBus
from clover_agent.hooks import HookConfig, Hooks
from clover_agent.sandboxes.base import Sandbox, SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.session.store import SavedSession
from clover_agent.tools.mcp import McpServerConfig, McpServers
from clover_agent.tools.registry import default_tools, plan_tools


@dataclass
class SessionConfig:
    """One agent session's configuration, the same for every front end (``fix``'s request holds one
    beside what is its own; the TUI and ACP run on one).

    - ``repo``: the user's repository; ``make_backend``: the model, made when the session needs it.
    - ``sandbox_kind``, ``spec``: the sandbox (``spec`` complete: ``launch.sandbox_spec``).
    - ``policy``: what the agent may do unasked (the MCP servers' tools are added to it);
      ``policy_chosen``: the person chose it for this start (a resumed session otherwise keeps
      the policy it had).
    - ``max_steps``, ``max_time_s``, ``max_tokens``: the agent's budget (None: no limit).
    - ``record_key``: signs the session's records (None: unsigned, never resumed).
    - ``mcp_servers``: servers whose tools the agent gets (started in the sandbox unless "host").
    - ``resume``: a saved interactive session to take up (the TUI, ACP).
    - ``hooks``: the user's hooks (and a trusted repository's): docs/hooks.md.
    """

    repo: Path
    make_backend: Callable[[], ModelBackend]
    spec: SandboxSpec
    sandbox_kind: str = "docker"
    policy: Policy = field(default_factory=lambda: preset(DEFAULT_PRESET))
    policy_chosen: bool = True
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    record_key: RecordKey | None = None
    mcp_servers: tuple[McpServerConfig, ...] = ()
    resume: SavedSession | None = None
    hooks: tuple[HookConfig, ...] = ()
    #: The agent's undo snapshots (git commits in the workspace); off where the workspace is the
    #: user's folder itself (``run --sandbox none``), whose ``.git`` is never written.
    checkpoints: bool = True


@dataclass
class AgentSession:
    """One session's parts, opened in order (:meth:`open_sandbox`, :meth:`open_agent`) and closed
    in reverse (:meth:`close_agent`, :meth:`close`). ``report`` names what did not start (an MCP
    server); ``folder``: where the servers' logs go."""

    config: SessionConfig
    bus: EventBus
    run_id: str
    folder: Path
    report: Callable[[str], None]
    sandbox: Sandbox | None = None
    mcp: McpServers | None = None
    agent: Agent | None = None
    hooks: Hooks | None = None  # made with the sandbox; the hand-back runs its PreHandBack hooks
    context: str = ""  # what the SessionStart hooks added for the model (in the system prompt)

    async def open_sandbox(self) -> Sandbox:
        """Make and start the sandbox; one that fails to start is closed again, and the error raised."""
        sandbox = create_sandbox(self.config.sandbox_kind, self.config.spec)
        try:
            await sandbox.start()
        except BaseException:
            with contextlib.suppress(*RUN_ERRORS, OSError):
                await sandbox.close()
            raise
        self.sandbox = sandbox
        self.hooks = Hooks(
            self.config.hooks,
            self.bus,
            session_id=self.run_id,
            repo=self.config.repo,
            transcript=self.folder / TRAJECTORY_FILE,
            environ=self.config.spec.host_env or None,
            sandbox=sandbox,
        )
        return sandbox

    async def open_agent(
        self,
        backend: ModelBackend,
        budget: Budget,
        approvals: Approvals | None,
        *,
        conversation: bool = False,
        planning: bool = False,
    ) -> Agent:
        """Start the MCP servers in the sandbox and build the agent with the policy, the default
        tools and the servers'. ``conversation``: a person reads the replies (see :class:`Agent`);
        ``planning``: it can plan (the plan tools are added)."""
        assert self.sandbox is not None, "open_sandbox first"
        servers = self.config.mcp_servers
        self.mcp = McpServers(servers, self.sandbox, report=self.report, log_dir=self.folder)
        await self.mcp.open_held()  # its clients in a task of their own: the close may run in another
        self.agent = Agent(
            backend,
            self.sandbox,
            self.bus,
            run_id=self.run_id,
            policy=with_mcp(self.config.policy, servers),
            approvals=approvals,
            budget=budget,
            tools=[*default_tools(), *(plan_tools() if planning else ()), *self.mcp.tools],
            conversation=conversation,
            hooks=self.hooks,
            checkpoints=self.config.checkpoints,
        )
        if self.hooks is not None:
            self.context = await self.hooks.session_start("resume" if self.config.resume else "startup")
        return self.agent

    async def system_prompt(self, note: str = "") -> str:
        """The system prompt of a new conversation: the sandbox's facts, then the front end's ``note``."""
        assert self.sandbox is not None, "open_sandbox first"
        context = f"\n\n# Context from the user's hooks\n{self.context}" if self.context else ""
        return system_prompt(await gather_facts(self.sandbox)) + note + context

    async def close_agent(self) -> None:
        """Stop the MCP servers (the agent's run is over; the sandbox stays)."""
        if self.mcp is not None:
            await self.mcp.close_held()
            self.mcp = None

    async def close(self, backend: ModelBackend | None = None) -> None:
        """Take everything down: the MCP servers, the model ``backend`` when given, then the sandbox
        (closed whatever the others raised)."""
        try:
            hooks, self.hooks = self.hooks, None
            if hooks is not None and self.agent is not None:
                await hooks.session_end("other")
            await self.close_agent()
            if backend is not None:
                await backend.close()
        finally:
            sandbox, self.sandbox = self.sandbox, None
            if sandbox is not None:
                await sandbox.close()
