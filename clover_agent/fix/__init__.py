"""The ``fix`` workflow beside the agent core: make failing tests pass and hand back a verified patch.

Front ends call :func:`run_fix` (:mod:`.workflow`) with a :class:`FixRequest` (:mod:`.request`).
The steps (:mod:`.steps`): TARGET resolved to tests (:mod:`.targets`) and the failure reproduced
(:mod:`.reproduce`), the agent, then the patch judged by :mod:`clover_agent.handback`.
:mod:`.runs` and :mod:`.resume` find and continue stopped runs; :mod:`.console` renders a run on
a terminal, and :mod:`.decision` decides the hand-back there.
"""

from clover_agent.fix.report import FixReport
from clover_agent.fix.reproduce import NothingToFix
from clover_agent.fix.request import FixRequest
from clover_agent.fix.runs import RUNS_DIR, locate_run, new_run_id, runs_dir
from clover_agent.fix.workflow import run_fix

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
