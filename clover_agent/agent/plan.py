"""Plan mode: look, think and propose before touching anything.

While an agent plans (:meth:`~clover_agent.agent.loop.Agent.start_planning`) it runs under
:data:`PLAN_POLICY` (read, search, run tests; every change and every shell command refused) and each
request carries :data:`PLAN_NOTE`. Its turn ends with ``propose_plan``: the run's outcome is
``planned`` and its :class:`Plan` goes to the person, who approves it (perhaps edited: a plan reads
and writes as Markdown, :meth:`Plan.markdown` and :func:`parse_plan`), or says what to change, or
leaves plan mode. Approved, the agent goes on under the policy the person chose with the plan in the
conversation (:func:`approved_message`), and ``update_plan`` tracks its steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from clover_agent.agent.policy import PRESETS, Decision, Policy, Rule
from clover_agent.errors import UsageError
from clover_agent.tools.plan import MAX_ITEM_CHARS, MAX_ITEMS, STEP_STATUSES

#: Read-only, and the plan's own tools: nothing in the workspace changes before a plan is approved.
PLAN_POLICY = Policy(
    "plan",
    (
        Rule(Decision.ALLOW, tool="propose_plan"),
        Rule(Decision.ALLOW, tool="update_plan"),
        *PRESETS["read-only"].rules,
    ),
    default=Decision.DENY,
)

#: Said with every request made in plan mode.
PLAN_NOTE = """[Plan mode: do not change anything yet. Read the code, search and run the tests to \
understand the request, then call `propose_plan` with the steps, the files you will change and how \
the change will be checked. Edits and shell commands are refused until the user approves a plan. \
To answer a question, reply in plain text.]

"""


def _status(value: Any) -> str:
    return value if isinstance(value, str) and value in STEP_STATUSES else "pending"


@dataclass
class PlanStep:
    step: str
    status: str = "pending"  # one of STEP_STATUSES


@dataclass
class Plan:
    """A plan: what it does (``summary``), its ``steps`` with their status, the ``files`` it changes
    and the ``checks`` that will show it works."""

    summary: str
    steps: list[PlanStep]
    files: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        steps = [
            PlanStep(str(s.get("step", "")), _status(s.get("status")))
            for s in data.get("steps") or []
            if isinstance(s, dict)
        ]
        return cls(
            str(data.get("summary", "")),
            steps,
            [str(f) for f in data.get("files") or []],
            [str(c) for c in data.get("checks") or []],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "steps": [{"step": s.step, "status": s.status} for s in self.steps],
            "files": list(self.files),
            "checks": list(self.checks),
        }

    def with_statuses(self, steps: list[dict[str, Any]]) -> Plan:
        """This plan with the steps an ``update_plan`` call gave (the agent may reword or add steps)."""
        return Plan(self.summary, Plan.from_dict({"steps": steps}).steps, self.files, self.checks)

    @property
    def done(self) -> int:
        return sum(s.status == "completed" for s in self.steps)

    def markdown(self) -> str:
        """The plan as a person reads and edits it (:func:`parse_plan` reads it back)."""
        marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
        lines = [self.summary.strip(), "", "## Steps"]
        lines += [f"{n}. {marks.get(s.status, '[ ]')} {s.step}" for n, s in enumerate(self.steps, 1)]
        if self.files:
            lines += ["", "## Files", *(f"- {f}" for f in self.files)]
        if self.checks:
            lines += ["", "## Checks", *(f"- {c}" for c in self.checks)]
        return "\n".join(lines)


_STEP = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(?:\[(?P<mark>[ x~])\]\s*)?(?P<text>.+?)\s*$")
_SECTIONS = {"steps": "steps", "files": "files", "checks": "checks", "check": "checks", "file": "files"}


def parse_plan(text: str) -> Plan:
    """A plan written (or edited) as :meth:`Plan.markdown` writes it: a summary, then ``## Steps``
    (numbered or bulleted), ``## Files`` and ``## Checks``. Lines before the first heading are the
    summary; list items with no heading are steps. Raises :class:`UsageError` when it has no step."""
    summary: list[str] = []
    found: dict[str, list[tuple[str, str]]] = {"steps": [], "files": [], "checks": []}
    section: str | None = None
    for line in text.splitlines():
        heading = re.match(r"^\s*#+\s*(\w+)", line)
        if heading:
            section = _SECTIONS.get(heading.group(1).lower(), section)
            continue
        item = _STEP.match(line)
        if item:
            mark = {"x": "completed", "~": "in_progress"}.get(item.group("mark") or " ", "pending")
            found[section or "steps"].append((item.group("text")[:MAX_ITEM_CHARS], mark))
        elif line.strip() and section is None:
            summary.append(line.strip())
    if not found["steps"]:
        raise UsageError("the plan has no steps: write them as a numbered or bulleted list")
    return Plan(
        " ".join(summary) or "The plan.",
        [PlanStep(text, mark) for text, mark in found["steps"][:MAX_ITEMS]],
        [text for text, _ in found["files"][:MAX_ITEMS]],
        [text for text, _ in found["checks"][:MAX_ITEMS]],
    )


def approved_message(plan: Plan, note: str = "") -> str:
    """What the agent reads when its plan is approved (``note``: what the person added)."""
    added = f"\nThey added: {note.strip()}\n" if note.strip() else ""
    return (
        "[The user approved this plan; you may now change files. Carry it out step by step, and call "
        "`update_plan` with every step's status as each one starts and ends. Check the result as the "
        "plan says, then call `finish`.]\n"
        f"{added}\n{plan.markdown()}"
    )
