"""What a ``fix`` run is asked: an agent session and what is ``fix``'s own.

Front ends (``clover-agent fix``, the CI bot, ``eval``) fill a :class:`FixRequest` and hand it
to :func:`clover_agent.fix.workflow.run_fix`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.agent.approvals import Approvals
from clover_agent.fix.regression import DEFAULT_SCOPE
from clover_agent.session.assembly import SessionConfig
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, default_test_timeout


@dataclass
class FixRequest:
    """One ``fix`` run.

    - ``session``: the agent session (repository, model, sandbox, policy, budget, record key, MCP
      servers); its backend is made only once a failure is confirmed.
    - ``target``: TARGET as the user gave it; "": the tests failing in the whole suite (or, with a
      ``request``, none).
    """

    target: str
    session: SessionConfig
    run_dir: Path | None = None  # where the run's files go; default <repo>/.clover/runs/<run id>
    command: str = "fix"  # the front end, as the trajectory's task events name it
    approvals: Approvals | None = None  # who answers what the policy asks about (None: no one)
    #: ``session.max_time_s`` is the whole run's wall-clock deadline (the CI bot's): it counts from
    #: the run's start, and the reproduction, the agent's tool calls and the verification are cut at it.
    whole_run_time: bool = False
    #: Exit codes the front end gives otherwise (the CI bot's 7 -> 1), in the summary and the
    #: trajectory's verdict alike.
    exit_codes: dict[int, int] = field(default_factory=dict)
    #: The exit code of a run whose request a UserPromptSubmit hook kept from the model (the CI
    #: bot's 10); None: the agent's, 1.
    blocked_exit_code: int | None = None
    suite_timeout_s: float = DEFAULT_TIMEOUT_S  # each whole-suite run (before and after)
    #: Each test's own limit in every run (a test past it fails alone); None: a fifth of the suite's.
    test_timeout_s: float | None = None
    regression: str = DEFAULT_SCOPE  # what the regression runs cover (clover_agent.fix.regression)
    #: The user's request, as the front end framed it for the model, put before the task.
    request: str = ""
    launch: dict[str, Any] = field(default_factory=dict)  # how the front end was started (recorded)
    keep_stream: bool = False  # also keep the streamed text and provisional blocks in the trajectory
    #: Plan first (``fix --plan``): "show" stops at the plan, "go" approves it and carries it out;
    #: "": no plan mode.
    plan: str = ""

    @property
    def per_test(self) -> float:
        """Each test's own limit in the run's test runs (``--test-timeout``, else a fifth of the suite's)."""
        return self.test_timeout_s or default_test_timeout(self.suite_timeout_s)
