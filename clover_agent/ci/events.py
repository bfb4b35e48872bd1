"""``--json-events``: the CI run's events as JSON Lines on stdout, a small versioned subset.

The trajectory (``trajectory.jsonl``) holds every event of the run in the agent's own, richer and
changing vocabulary. What a CI job consumes as the run goes is this subset instead, stable within a
version (:data:`EVENTS_VERSION`, its JSON Schema :data:`EVENTS_SCHEMA_FILE`; version 1, still
written on request, :data:`V1_SCHEMA_FILE`); the types, their fields and the versioning rule are
in docs/ci.md ("--json-events"). Long texts are cut (:data:`TEXT_LIMIT` characters), and what a
terminal or the CI runner would act on is written as a JSON escape (:class:`JsonEvents`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

import jsonschema
from referencing import Registry, Resource

from clover_agent import __version__, safe_text
from clover_agent.ci.result import result_schema
from clover_agent.events import (
    Event,
    ModelResponded,
    TaskStarted,
    TestsRun,
    ToolCallFinished,
    ToolCallStarted,
    WorkspaceChanged,
)

EVENTS_VERSION = 2
VERSIONS = (1, 2)
EVENTS_SCHEMA_FILE = Path(__file__).with_name("events.schema.json")
V1_SCHEMA_FILE = Path(__file__).with_name("events.v1.schema.json")
#: Characters of one text field in an event line.
TEXT_LIMIT = 4000
#: Failing test ids named in a ``tests`` line.
FAILING_SHOWN = 50
#: Left raw by ``json.dumps`` without ``ensure_ascii`` (which escapes only C0 controls).
_RAW_UNSAFE = re.compile(f"[\\x7f-\\x9f\\u2028\\u2029{safe_text.BIDI_CONTROLS}\\ud800-\\udfff]")


def events_schema(version: int = EVENTS_VERSION) -> dict[str, Any]:
    """The JSON Schema of one ``--json-events`` line of ``version`` (``finished.result`` refers to
    ``result.schema.json`` by its ``$id``: :func:`events_validator` resolves it)."""
    path = V1_SCHEMA_FILE if version == 1 else EVENTS_SCHEMA_FILE
    return json.loads(path.read_text(encoding="utf-8"))


def events_validator(version: int = EVENTS_VERSION) -> jsonschema.protocols.Validator:
    """A validator of one line, the result schema its ``finished.result`` refers to included."""
    result = result_schema()
    registry: Registry[Any] = Registry().with_resource(result["$id"], Resource.from_contents(result))
    schema = events_schema(version)
    return jsonschema.validators.validator_for(schema)(schema, registry=registry)


class JsonEvents:
    """Bus subscriber writing the subset to ``out``, one flushed line per event; :meth:`finished`
    writes the last line.

    Every line is one object with ``v``, ``type``, ``time`` and ``run_id``. What a terminal or the
    CI runner would act on is written as a JSON escape (the same text once decoded): every control
    character, bidirectional controls, and the ``#`` of ``##[`` (an old-form workflow command
    anywhere in a log line)."""

    def __init__(self, out: TextIO, version: int = EVENTS_VERSION) -> None:
        self.out = out
        self.version = version
        self.run_id: str | None = None
        self.tokens = 0  # read and written so far (the usage lines' total)

    def __call__(self, event: Event) -> None:
        line = self._line(event)
        before, after = self._v2_lines(event) if self.version >= 2 else ([], [])
        for each in [*before, *([line] if line is not None else []), *after]:
            self._write(each["type"], event.time, each["fields"])

    def _v2_lines(self, event: Event) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Version 2's own lines for ``event``: those before its version 1 line, those after."""
        if isinstance(event, ModelResponded):
            self.tokens += event.prompt_tokens + event.completion_tokens
            reasoning = (event.reasoning or "").strip()
            usage = _of(
                "usage",
                step=event.step,
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                total_tokens=self.tokens,
                seconds=round(event.seconds, 3),
                cost=None,
            )
            return ([_of("reasoning", step=event.step, text=_cut(reasoning))] if reasoning else []), [usage]
        if isinstance(event, WorkspaceChanged):
            files, added, removed = _diff_files(event.patch)
            change = _of("file_change", step=event.step, call_id=event.call_id, files=files,
                         added_lines=added, removed_lines=removed)  # fmt: skip
            return [], [change]
        return [], []

    def finished(self, result: dict[str, Any], time: float) -> None:
        self.run_id = result.get("run_id") or self.run_id
        self._write(
            "finished",
            time,
            {
                "status": result["status"],
                "exit_code": result["exit_code"],
                "message": result["message"],
                "result": result,
            },
        )

    def _line(self, event: Event) -> dict[str, Any] | None:
        if isinstance(event, TaskStarted):
            self.run_id = event.run_id
            return _of("run_started", repo=event.repo, target=event.target or None, version=__version__)
        if isinstance(event, ModelResponded):
            return _of(
                "turn",
                step=event.step,
                text=_cut(event.content),
                tool_calls=[(call.get("function") or {}).get("name", "") for call in event.tool_calls],
                format_error=event.format_error,
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                finish_reason=event.finish_reason,
            )
        if isinstance(event, ToolCallStarted):
            arguments = {k: _cut(v) if isinstance(v, str) else v for k, v in event.arguments.items()}
            return _of(
                "tool_call", step=event.step, call_id=event.call_id, name=event.name, arguments=arguments
            )
        if isinstance(event, ToolCallFinished):
            return _of(
                "tool_result",
                step=event.step,
                call_id=event.call_id,
                name=event.name,
                is_error=event.is_error,
                output=_cut(event.output),
                duration_s=round(event.duration_s, 3),
            )
        if isinstance(event, TestsRun):
            report = event.report
            outcomes = report.get("outcomes") or {}
            failing = [t for t, outcome in outcomes.items() if outcome in ("failed", "error")]
            return _of(
                "tests",
                phase=event.phase,
                target=event.target or None,
                passed=report.get("passed", 0),
                failed=report.get("failed", 0),
                errors=report.get("errors", 0),
                skipped=report.get("skipped", 0),
                all_passed=bool(report.get("all_passed")),
                failing=failing[:FAILING_SHOWN],
                problem=report.get("problem"),
            )
        return None

    def _write(self, kind: str, time: float, fields: dict[str, Any]) -> None:
        line = {"v": self.version, "type": kind, "time": round(time, 3), "run_id": self.run_id, **fields}
        text = json.dumps(line, ensure_ascii=False, default=str)
        text = _RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).replace("##[", "#\\u0023[")
        self.out.write(text + "\n")
        self.out.flush()


def _of(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "fields": fields}


def _diff_files(patch: str) -> tuple[list[dict[str, str]], int, int]:
    """The files a workspace diff changes (path as git names it, and how), and its lines added and
    removed."""
    files: list[dict[str, str]] = []
    added = removed = 0
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            path = line.removeprefix("diff --git ").rpartition(" b/")[2] or line
            files.append({"path": path, "change": "modified"})
        elif files and line.startswith("new file mode"):
            files[-1]["change"] = "added"
        elif files and line.startswith("deleted file mode"):
            files[-1]["change"] = "deleted"
        elif files and line.startswith("rename from"):
            files[-1]["change"] = "renamed"
        elif line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return files, added, removed


def _cut(text: str) -> str:
    if len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n[... {len(text) - TEXT_LIMIT:,} more characters in the trajectory]"
