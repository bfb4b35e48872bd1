"""Stuck detection: the same tool call, or the same error, over and over.

Calls and errors are watched as two separate streams (a repeated failing call shows up in both).
After ``repeats`` identical observations in a row in either stream the agent gets one nudge (a
message asking it to change course). One more repetition right after the nudge, or a later run of
``repeats`` identical observations, stops the run with :class:`AgentStuck` — one nudge per run,
then stop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clover_agent.errors import CloverError, ExitCode


class AgentStuck(CloverError):
    """The agent kept repeating itself after being told to change course."""

    exit_code = ExitCode.AGENT_ERROR


NUDGE = (
    "You have repeated the same {what} {count} times in a row without progress. Stop and change "
    "course: re-read the relevant code or the test output, try a different approach, or call "
    "`finish` if the task is done. Repeating it again ends the task."
)


@dataclass
class StuckDetector:
    repeats: int = 3
    nudged: bool = False
    _streaks: dict[str, tuple[str | None, int]] = field(default_factory=dict)

    def observe(self, call: tuple[str, dict[str, Any]] | None = None, error: str | None = None) -> str | None:
        """Record one step's outcome: the call made (if any) and its error (None: it went fine).

        Returns a nudge message when one is due; raises :class:`AgentStuck` when stuck.
        """
        if call is not None:
            name, arguments = call
            self._update("tool call", name + " " + json.dumps(arguments, sort_keys=True, ensure_ascii=False))
        self._update("error", None if error is None else error.strip())
        repeated = [
            (what, sig, n)
            for what, (sig, n) in self._streaks.items()
            if sig is not None and n >= self.repeats
        ]
        if not repeated:
            return None
        what, signature, count = repeated[0]
        if self.nudged:
            shown = signature if len(signature) <= 160 else signature[:159] + "…"
            raise AgentStuck(
                f"the agent is stuck: it repeated the same {what} {count} times, also after being "
                f"told to change course ({shown})"
            )
        self.nudged = True
        return NUDGE.format(what=what, count=self.repeats)

    def _update(self, what: str, signature: str | None) -> None:
        last, count = self._streaks.get(what, (None, 0))
        count = count + 1 if signature is not None and signature == last else 1
        self._streaks[what] = (signature, count)
