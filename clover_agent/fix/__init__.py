"""The ``fix`` workflow beside the agent core: make failing tests pass and hand back a verified patch.

:func:`run_fix` (:mod:`.workflow`) is the entry point front ends call with a :class:`FixRequest`
(a complete sandbox spec, a backend factory, a run folder); :mod:`.targets` resolves TARGET to
tests, :mod:`.handback` makes, verifies, judges and applies the patch, :mod:`.runs` and
:mod:`.resume` find and continue stopped runs, :mod:`.diagnosis` tells environment problems from bugs in a first run,
:mod:`.console` renders a run's events on a terminal and asks its approvals there.
"""

from clover_agent.fix.report import FixReport
from clover_agent.fix.runs import RUNS_DIR, locate_run, new_run_id, runs_dir
from clover_agent.fix.workflow import FixRequest, NothingToFix, run_fix

__all__ = [
    "RUNS_DIR",
    "FixReport",
    "FixRequest",
    "NothingToFix",
    "locate_run",
    "new_run_id",
    "run_fix",
    "runs_dir",
]
