"""What every tool shares: the result type, the per-task context and the ``Tool`` base class.

A tool publishes an OpenAI-style function spec (name, description, JSON Schema of its
parameters), says what a call is for the policy (:meth:`Tool.action`, :meth:`Tool.mutates`,
:meth:`Tool.command_line`) and runs with ``await tool.run(args, ctx)``. Arguments are validated against the
schema first (:meth:`Tool.validate`); a tool signals a bad call by raising :class:`ToolError`,
which :func:`clover_agent.tools.registry.run_call` turns into ``ToolResult(ok=False, ...)`` so the
model reads the message and the agent loop never sees an exception.
"""

from __future__ import annotations

import abc
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jsonschema

from clover_agent.sandboxes.base import OutputSink, Sandbox


@dataclass
class ToolResult:
    """Outcome of one tool call.

    ``output`` is exactly what the model reads; ``data`` holds the structured, untruncated
    details for the trajectory and the UI (full shell output, diffs, old and new file content,
    test reports). ``ends_task`` is set by ``finish``.
    """

    ok: bool
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    ends_task: bool = False


#: The model sees the first and last this many bytes of a long output; ``data`` keeps all of it.
OUTPUT_HEAD_BYTES = 8 * 1024
OUTPUT_TAIL_BYTES = 8 * 1024


def head_tail(text: str, head: int = OUTPUT_HEAD_BYTES, tail: int = OUTPUT_TAIL_BYTES) -> str:
    """``text`` cut to its first ``head`` and last ``tail`` bytes (UTF-8), the cut noted."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= head + tail:
        return text
    omitted = len(data) - head - tail
    first = data[:head].decode("utf-8", "ignore")
    last = data[-tail:].decode("utf-8", "ignore")
    return f"{first}\n[... {omitted} bytes omitted; the output was {len(data)} bytes in total ...]\n{last}"


class ToolError(Exception):
    """A bad call (wrong arguments, refused path, missing file): its message goes to the model."""


@dataclass
class ToolContext:
    """Per-task state the tools keep between calls; one per sandbox (one sandbox per task).

    ``session_id`` names the shell session; ``edit_history`` maps a sandbox path to the file's
    earlier contents (``None`` = the file did not exist), newest last, for ``undo_edit``.
    ``on_output``: where a call that runs a command (shell, run_tests) sends its output as it comes
    (set per call by the agent, ``dataclasses.replace``; the result still holds all of it).
    """

    sandbox: Sandbox
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    edit_history: dict[str, list[bytes | None]] = field(default_factory=dict)
    on_output: OutputSink | None = None

    # Keyed weakly by sandbox; the values must not refer to the sandbox, or it would never be freed.
    _state_by_sandbox: ClassVar[
        weakref.WeakKeyDictionary[Sandbox, tuple[str, dict[str, list[bytes | None]]]]
    ] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, sandbox: Sandbox) -> ToolContext:
        """The context of ``sandbox``: the same session and edit history on every call while it lives."""
        state = cls._state_by_sandbox.get(sandbox)
        if state is None:
            ctx = cls(sandbox)
            cls._state_by_sandbox[sandbox] = (ctx.session_id, ctx.edit_history)
            return ctx
        return cls(sandbox, *state)


class Tool(abc.ABC):
    """A tool the model can call. Subclasses set ``name``, ``description``, ``parameters``."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]  # JSON Schema of the arguments object

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function spec the model sees."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, args: object, *, schema_checked: bool = False) -> None:
        """Raise :class:`ToolError` with a readable message when ``args`` break the schema or hold
        strings no command or file can (``schema_checked``: the schema was checked already, by the
        backend's parser; only the strings are)."""
        if not isinstance(args, dict):
            raise ToolError(
                f"Invalid arguments for tool `{self.name}`: expected a JSON object, got {type(args).__name__}."
            )
        validator = jsonschema.Draft202012Validator(self.parameters)
        errors = [] if schema_checked else validator.iter_errors(args)
        errors = sorted(errors, key=lambda e: (list(e.absolute_path), e.message))
        if errors:
            lines = [_describe(e) for e in errors]
            raise ToolError(f"Invalid arguments for tool `{self.name}`: " + "; ".join(lines))
        for where, problem in _bad_strings(args, ""):
            raise ToolError(f"Invalid arguments for tool `{self.name}`: `{where}` {problem}.")

    def action(self, args: dict[str, Any]) -> str:
        """What a policy's ``tool`` pattern matches for this call (the editor: ``editor:<command>``)."""
        return self.name

    def mutates(self, args: dict[str, Any]) -> bool:
        """Whether this call may change the workspace (the agent snapshots it first)."""
        return False

    def command_line(self, args: dict[str, Any]) -> str | None:
        """The command line this call runs, if it runs one (a policy's ``command`` pattern matches it)."""
        return None

    @abc.abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run one validated call. Raise :class:`ToolError` for a bad call."""


def bad_text(value: str) -> str | None:
    """Why ``value`` cannot be an argument, or None: a NUL byte (no command, path or environment
    variable can hold one) or a lone surrogate (not a character at all)."""
    nul = value.find("\0")
    if nul >= 0:
        return (
            f"contains a NUL byte (character {nul + 1}), which no command, file name or text file can "
            "hold; remove it (a command can still make one, e.g. with printf '\\0')"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate (\\u{ord(value[exc.start]):04x}, character {exc.start + 1}), "
            "which is not valid Unicode; write the character it was meant to be"
        )
    return None


def _bad_strings(value: object, where: str) -> list[tuple[str, str]]:
    """(argument path, problem) for each string in ``value`` that :func:`bad_text` refuses."""
    if isinstance(value, str):
        problem = bad_text(value)
        return [] if problem is None else [(where, problem)]
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            found += _bad_strings(str(key), name) + _bad_strings(item, name)
        return found
    if isinstance(value, list):
        return [f for i, item in enumerate(value) for f in _bad_strings(item, f"{where}[{i}]")]
    return []


def valid_unicode(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8: lone surrogates (file names that are
    not UTF-8 arrive in ``surrogateescape`` form) become ``\\udcxx`` escapes, so whatever writes a
    result out (a terminal, a trajectory file) never fails on it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [valid_unicode(v) for v in value]
    return value


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    return f"`{where}`: {error.message}" if where else error.message
