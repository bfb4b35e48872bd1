"""The agent core: the loop, its budgets, policy, context, checkpoints and trajectory.

Front ends (``fix``, the TUI, the CI bot) build an :class:`Agent`, subscribe to its
:class:`~clover_agent.events.EventBus` and call :meth:`Agent.run`.
"""

from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.loop import Agent, RunResult, Submitted
from clover_agent.agent.stuck import AgentStuck
from clover_agent.agent.trajectory import ResumeState, TrajectoryWriter, load_trajectory

__all__ = [
    "Agent",
    "AgentStuck",
    "Budget",
    "LimitsExceeded",
    "ResumeState",
    "RunResult",
    "Submitted",
    "TrajectoryWriter",
    "load_trajectory",
]
