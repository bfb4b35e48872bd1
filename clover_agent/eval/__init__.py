"""``clover-agent eval``: the fix workflow run over a set of tasks and graded like SWE-bench.

A front end beside the CLI's ``fix`` and the CI bot: :mod:`.tasks` loads and checks the task set,
:mod:`.source` makes each task's repository, :mod:`.scripts` writes the gold and empty replays,
:mod:`.grade` grades a patch in a fresh sandbox and :mod:`.harness` runs the set and writes the
predictions and reports.
"""
