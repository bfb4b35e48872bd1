"""The trajectory: the events of a run as JSON Lines, and the resume state rebuilt from it.

The writer is a plain bus subscriber, so each event is on disk (flushed) before the loop goes on: a
run killed at any point leaves a trajectory that ends at the last thing that happened. A resumed
run appends to the same file, so one file holds the whole history. The file is compact: each turn
and each output is stored once (how: docs/architecture.md, "Events"), and :func:`read_events`
gives back the events as they were emitted.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from clover_agent.agent.checkpoints import Recorded
from clover_agent.agent.records import RecordKey
from clover_agent.events import (
    CheckpointTaken,
    ContextCondensed,
    Done,
    ErrorReported,
    Event,
    MessageAdded,
    ModelDelta,
    ModelResponded,
    ProvisionalBlock,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
    WorkspaceChanged,
    WorkspaceUndone,
    event_from_dict,
)

TRAJECTORY_FILE = "trajectory.jsonl"


class TrajectoryWriter:
    """Appends each event as one compact JSON line to ``path`` (parents created; see the module
    docstring); ``keep_stream`` also writes the streamed deltas, provisional blocks and tool output.

    Text is written as UTF-8 (``ensure_ascii=False``, readable as it is). A lone surrogate (model
    text decoded with ``surrogateescape``, an undecodable file name) has no UTF-8 form: it is
    written as its JSON escape (``\\udc80``, what ``backslashreplace`` makes of it, and surrogates
    only occur inside JSON strings), so the line is valid JSON and reads back to the same text.

    ``key``: each line is signed as it is written (:mod:`clover_agent.agent.records`).
    """

    def __init__(self, path: Path, *, keep_stream: bool = False, key: RecordKey | None = None) -> None:
        self.path = path
        self.keep_stream = keep_stream
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = path.open("a", encoding="utf-8", errors="backslashreplace")
        self._sealer = None if key is None else key.sealer(path.parent, path.name)
        self._turn: dict[str, Any] | None = None  # the assistant message of the last ModelResponded
        self._calls: dict[str, Any] = {}  # call id -> its arguments in that turn
        self._results: dict[str, dict[str, Any]] = {}  # call id -> the tool message its result makes
        self._patch: str | None = None  # of the last WorkspaceChanged

    def __call__(self, event: Event) -> None:
        if self._file is None or (isinstance(event, STREAM_EVENTS) and not self.keep_stream):
            return
        line = json.dumps(self._compact(event), ensure_ascii=False, default=str) + "\n"
        self._file.write(line)
        self._file.flush()
        if self._sealer is not None:
            self._sealer.add(line.encode("utf-8", "backslashreplace"))

    def _compact(self, event: Event) -> dict[str, Any]:
        data = event.to_dict()
        if isinstance(event, ModelResponded):
            self._turn = _turn_message(event)
            self._calls = _call_arguments(event.tool_calls)
            for key in ("content", "reasoning"):
                span = _span(event.raw, data[key])
                if span is not None:
                    del data[key]
                    data[f"{key}_span"] = span
            spans = []
            for index, call in enumerate(data["tool_calls"]):
                arguments = call.get("function", {}).get("arguments")
                for name, value in list(arguments.items()) if isinstance(arguments, dict) else ():
                    span = _span(event.raw, value) if isinstance(value, str) and len(value) >= 64 else None
                    if span is not None:
                        spans.append([index, name, *span])
                        del arguments[name]
            if spans:
                data["argument_spans"] = spans
        elif isinstance(event, ToolCallStarted):
            if event.call_id in self._calls and self._calls[event.call_id] == event.arguments:
                del data["arguments"]
                data["arguments_from"] = "turn"
        elif isinstance(event, WorkspaceChanged):
            self._patch = event.patch
        elif isinstance(event, Done) and event.patch and event.patch == self._patch:
            del data["patch"]
            data["patch_from"] = WorkspaceChanged.type
        elif isinstance(event, ToolCallFinished):
            self._results = {event.call_id: _result_message(event)}
            if data["full_output"] == data["output"]:
                del data["full_output"]
            else:
                parts = _head_and_tail(event.output, event.full_output)
                if parts is not None:
                    del data["output"]
                    data["output_from_full"] = parts
        elif isinstance(event, MessageAdded):
            if event.message == self._turn:
                data["from"] = "turn"
                del data["message"]
            elif event.message == self._results.get(str(event.message.get("tool_call_id"))):
                data.update({"from": "call", "call_id": event.message["tool_call_id"]})
                del data["message"]
        return data

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


#: Streamed while the model writes or a command runs; the complete turn or result follows, holding
#: what they held (not written unless asked for: a long command would add thousands of lines).
STREAM_EVENTS = (ModelDelta, ProvisionalBlock, ToolOutput)


def _turn_message(event: ModelResponded) -> dict[str, Any]:
    """The assistant message the loop adds for this turn (``ModelTurn.to_message``)."""
    message: dict[str, Any] = {"role": "assistant", "content": event.content}
    if event.reasoning is not None:
        message["reasoning_content"] = event.reasoning
    if event.tool_calls:
        message["tool_calls"] = event.tool_calls
    return message


def _call_arguments(tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Call id -> arguments, for the calls of one turn."""
    return {str(c.get("id")): c.get("function", {}).get("arguments") for c in tool_calls}


def _result_message(event: ToolCallFinished) -> dict[str, Any]:
    """The tool message the loop adds for this result."""
    return {"role": "tool", "tool_call_id": event.call_id, "name": event.name, "content": event.output}


def _head_and_tail(output: str, full: str) -> list[Any] | None:
    """``[head, between, tail, after]`` when ``output`` is ``full[:head] + between +
    full[len(full) - tail:] + after`` and most of it comes from ``full`` (a long output cut to its
    head and tail for the model, a note between and after); else None."""
    head = _common_prefix(output, full)
    rest = output[head:]
    probe = full[max(head, len(full) - 64) :]
    found = rest.rfind(probe) if probe else -1
    if found < 0:
        tail, between, after = 0, rest, ""
    else:
        end = found + len(probe)
        limit = min(end, len(full) - head)
        tail = _common_prefix(rest[end - limit : end][::-1], full[len(full) - limit :][::-1])
        between, after = rest[: end - tail], rest[end:]
    return [head, between, tail, after] if 2 * (len(between) + len(after)) < len(output) else None


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of two strings (at C speed)."""
    return len(os.path.commonprefix([a, b]))  # noqa: RUF071 - characters are what is compared here


def _span(raw: str, piece: Any) -> list[int] | None:
    if not isinstance(piece, str) or not piece:
        return None
    start = raw.find(piece)
    return None if start < 0 else [start, start + len(piece)]


class _Expander:
    """Turns the compact lines back into the events' own dicts (the writer's inverse)."""

    def __init__(self) -> None:
        self._turn: dict[str, Any] | None = None
        self._calls: dict[str, Any] = {}
        self._results: dict[str, dict[str, Any]] = {}
        self._patch = ""

    def expand(self, data: dict[str, Any]) -> dict[str, Any]:
        kind = data.get("type")
        if kind == ModelResponded.type:
            raw = data["raw"]
            for key in ("content", "reasoning"):
                span = data.pop(f"{key}_span", None)
                if span is not None:
                    data[key] = raw[span[0] : span[1]]
            for index, name, start, end in data.pop("argument_spans", ()):
                data["tool_calls"][index]["function"]["arguments"][name] = raw[start:end]
            self._turn = _turn_message(cast(ModelResponded, event_from_dict(dict(data))))
            self._calls = _call_arguments(data["tool_calls"])
        elif kind == ToolCallStarted.type and data.pop("arguments_from", None) == "turn":
            data["arguments"] = copy.deepcopy(self._calls[str(data["call_id"])])
        elif kind == WorkspaceChanged.type:
            self._patch = data.get("patch", "")
        elif kind == Done.type and data.pop("patch_from", None) == WorkspaceChanged.type:
            data["patch"] = self._patch
        elif kind == ToolCallFinished.type:
            if "output_from_full" in data:
                head, between, tail, after = data.pop("output_from_full")
                full = data["full_output"]
                data["output"] = full[:head] + between + full[len(full) - tail :] + after
            data.setdefault("full_output", data.get("output", ""))
            finished = cast(ToolCallFinished, event_from_dict(dict(data)))
            self._results[finished.call_id] = _result_message(finished)
        elif kind == MessageAdded.type and "message" not in data:
            origin = data.pop("from", None)
            if origin == "turn" and self._turn is not None:
                data["message"] = copy.deepcopy(self._turn)
            elif origin == "call" and str(data.get("call_id")) in self._results:
                data["message"] = copy.deepcopy(self._results[str(data.pop("call_id"))])
            else:
                raise KeyError(f"a message from {origin!r} with nothing before it to take it from")
        return data


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
    expander = _Expander()
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
            events.append(event_from_dict(expander.expand(data)))
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
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
            assert started_at is not None  # a Done with no run going on was skipped above
            state.patch = event.patch
            state.last_outcome = event.outcome
            state.elapsed_s += event.time - started_at
            started_at = None
    if state is None:
        raise ValueError(f"{path} holds no run")
    return state
