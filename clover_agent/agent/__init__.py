"""The agent core: the loop, its budgets, policy and approvals, context, checkpoints and trajectory.

Front ends (``fix``, the TUI, the CI bot) build an :class:`Agent`, subscribe to its
:class:`~clover_agent.events.EventBus`, call :meth:`Agent.run` (then :meth:`Agent.continue_with`
for a later request) and steer it from their own tasks: :meth:`Agent.send`, :meth:`Agent.interrupt`,
:meth:`Agent.answer_approval` (with :class:`Approvals`), :meth:`Agent.undo`.
"""

from clover_agent.agent.approvals import Answer, Approvals
from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.loop import Agent, RunResult, Submitted
from clover_agent.agent.stuck import AgentStuck
from clover_agent.agent.trajectory import ResumeState, TrajectoryWriter, load_trajectory

__all__ = [
    "Agent",
    "AgentStuck",
    "Answer",
    "Approvals",
    "Budget",
    "LimitsExceeded",
    "ResumeState",
    "RunResult",
    "Submitted",
    "TrajectoryWriter",
    "load_trajectory",
]
