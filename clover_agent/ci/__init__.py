"""The headless CI bot, ``clover-agent ci``: a task (an issue's text, a failing job) in, a verified
patch and a report out, safe with untrusted input.

:mod:`.run` runs it on the ``fix`` workflow; :mod:`.sanitize` cleans and frames the task text,
:mod:`.safety` keeps secrets and credentials out of the sandbox, :mod:`.result` writes
``result.json`` (its JSON Schema beside it) and ``summary.md``, :mod:`.events` the ``--json-events``
lines. docs/ci.md describes the command, its files and events, and the example workflows.
"""

from clover_agent.ci.run import CiRequest, run_ci

__all__ = ["CiRequest", "run_ci"]
