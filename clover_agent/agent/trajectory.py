"""The trajectory: every event of a run as JSON Lines, and the resume state rebuilt from it.

The writer is a plain bus subscriber, so each event is on disk (flushed) before the loop goes on:
a run killed at any point leaves a trajectory that ends at the last thing that happened. A resumed
run appends to the same file, so one file holds the whole history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from clover_agent.agent.checkpoints import Recorded
from clover_agent.events import (
    CheckpointTaken,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    MessageAdded,
    ModelResponded,
    RunStarted,
    WorkspaceChanged,
    WorkspaceUndone,
    event_from_dict,
)

TRAJECTORY_FILE = "trajectory.jsonl"


class TrajectoryWriter:
    """Appends each event as one JSON line to ``path`` (parents created).

    Text is written as UTF-8 (``ensure_ascii=False``, readable as it is). A lone surrogate (model
    text decoded with ``surrogateescape``, an undecodable file name) has no UTF-8 form: it is
    written as its JSON escape (``\\udc80``, what ``backslashreplace`` makes of it, and surrogates
    only occur inside JSON strings), so the line is valid JSON and reads back to the same text.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = path.open("a", encoding="utf-8", errors="backslashreplace")

    def __call__(self, event: Event) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(event.to_dict(), ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TrajectoryError(ValueError):
    """A trajectory file cannot be read back: ``str()`` names the file and line."""


def read_events(path: Path) -> list[Event]:
    """Every event in a trajectory file, in order (a torn last line from a killed run is skipped).

    Raises :class:`TrajectoryError` naming the line that is not an event.
    """
    events = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TrajectoryError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not line.endswith("}"):  # torn by a kill mid-write
                break
            raise TrajectoryError(
                f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        if not isinstance(data, dict):
            raise TrajectoryError(f"{path}:{number}: not a trajectory event (a JSON {type(data).__name__})")
        try:
            events.append(event_from_dict(data))
        except (KeyError, TypeError, AttributeError) as exc:
            raise TrajectoryError(
                f"{path}:{number}: not a trajectory event ({type(exc).__name__}: {exc})"
            ) from exc
    return events


@dataclass
class ResumeState:
    """What a resumed run needs: the conversation and what was spent, plus the workspace patch and
    the snapshots undo can go back to (not undone yet, oldest first)."""

    run_id: str
    task: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    patch: str = ""
    last_outcome: str | None = None
    checkpoints: list[Recorded] = field(default_factory=list)


def load_trajectory(path: Path) -> ResumeState:
    """Rebuild the conversation, the budget spent and the workspace patch from a trajectory file.

    The patch is the last one recorded (the final ``Done``, or a ``WorkspaceChanged`` after it when
    a resumed segment was cut off), so a run killed before its end resumes from its last change.
    Raises :class:`ValueError` when the file holds no agent run (e.g. ``fix`` stopped before it),
    :class:`TrajectoryError` (a ``ValueError``) when a line is not an event.
    """
    state: ResumeState | None = None
    started_at: float | None = None  # of the agent run going on; None between runs
    patch_known = True  # whether state.patch is the workspace as it is (see ErrorReported below)
    for event in read_events(path):
        if isinstance(event, RunStarted):
            if state is None or not event.resumed:
                state = ResumeState(run_id=event.run_id, task=event.task)
            started_at = event.time
            continue
        if state is None:  # the front end's own events before the agent started (test runs, ...)
            continue
        if isinstance(event, Done) and started_at is None:
            continue  # a front end's verdict when no agent ran (e.g. the sandbox failed to start)
        if isinstance(event, MessageAdded):
            state.messages.append(event.message)
        elif isinstance(event, ContextCondensed):
            state.messages = list(event.messages)
        elif isinstance(event, WorkspaceChanged):
            state.patch, patch_known = event.patch, True
        elif isinstance(event, ErrorReported) and event.kind == "workspace":
            patch_known = False  # a change whose diff could not be read: not recorded
        elif isinstance(event, CheckpointTaken):  # it holds the workspace as last recorded
            state.checkpoints.append(Recorded(event.turn, event.tool, state.patch if patch_known else None))
        elif isinstance(event, WorkspaceUndone):  # Checkpoints.undo_to forgets the undone ones
            state.checkpoints = [c for c in state.checkpoints if c.turn < event.step]
        elif isinstance(event, ModelResponded):
            state.steps += 1
            state.tokens += event.prompt_tokens + event.completion_tokens
        elif isinstance(event, Done):
            state.patch = event.patch
            state.last_outcome = event.outcome
            state.elapsed_s += event.time - started_at
            started_at = None
    if state is None:
        raise ValueError(f"{path} holds no run")
    return state
