"""The CI run's report: ``result.json`` (machine-readable, with a JSON Schema shipped beside this
module) and ``summary.md`` (a short report fit for a pull-request comment).

``result.json`` is built from the ``fix`` workflow's summary (:meth:`FixReport.to_dict`), the
sanitised task and what the bot knows itself (the starting commit, the output files); its schema
is :data:`RESULT_SCHEMA_FILE` (``schema_version`` 1). Everything the model could shape (its summary,
test and file names) goes into ``summary.md`` inside code spans or a fenced block, so a comment
made from it renders no links, mentions, images or HTML from the model, and
:func:`clover_agent.safe_text.terminal_safe`, so the human log that repeats it holds no escape
sequence and no workflow command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clover_agent import __version__
from clover_agent.errors import ExitCode
from clover_agent.safe_text import terminal_safe

RESULT_FILE = "result.json"
SUMMARY_MD = "summary.md"
RESULT_SCHEMA_FILE = Path(__file__).with_name("result.schema.json")
SCHEMA_VERSION = 1

#: The bot's status for each exit code (the ``fix`` table's codes where the meanings match).
STATUS = {
    ExitCode.OK: "fixed",
    ExitCode.SUITE_UNVERIFIED: "fixed_suite_unverified",
    ExitCode.NEEDS_REVIEW: "needs_review",
    ExitCode.FAILURE: "not_fixed",
    ExitCode.USAGE: "usage_error",
    ExitCode.MODEL_UNAVAILABLE: "backend_unavailable",
    ExitCode.SANDBOX_UNAVAILABLE: "sandbox_unavailable",
    ExitCode.NOTHING_TO_FIX: "nothing_to_fix",
    ExitCode.BUDGET_EXHAUSTED: "budget_exhausted",
    ExitCode.BLOCKED: "blocked",
    ExitCode.INTERRUPTED: "interrupted",
}
#: Failing test ids listed per test run (the counts are always whole).
FAILING_SHOWN = 100
PHASES = (
    "target_before",
    "suite_before",
    "target_after",
    "suite_after",
    "target_handed_back",
    "tests_handed_back",
    "without_change",
)


def ci_exit_code(code: int) -> ExitCode:
    """The bot's exit code for the workflow's: an agent that stopped (stuck, replay exhausted,
    malformed calls: ``fix``'s 7) did not fix it, which for a CI job is 1."""
    return ExitCode.FAILURE if code == ExitCode.AGENT_ERROR else ExitCode(code)


def result_schema() -> dict[str, Any]:
    """The JSON Schema of ``result.json``."""
    return json.loads(RESULT_SCHEMA_FILE.read_text(encoding="utf-8"))


def build_result(
    *,
    exit_code: int,
    message: str,
    fix: dict[str, Any] | None,
    task: dict[str, Any],
    repo: Path,
    starting_commit: str | None,
    patch_text: str,
    apply: str | None,
    trajectory: bool,
    target: str | None,
) -> dict[str, Any]:
    """``result.json``'s content. ``fix``: the workflow's summary (None when the run never
    started: a usage error found first)."""
    code = ci_exit_code(exit_code)
    fix = fix or {}
    tests = fix.get("tests") or {}
    agent = fix.get("agent")
    suite_after = tests.get("suite_after")
    regressions = list(fix.get("regressions") or [])
    unverified = list(fix.get("unverified") or [])
    # A fixed run's patch is the one verified (on its exact bytes); with the suite unverified, the
    # target's check only; any other is what the agent left, unverified.
    if code == ExitCode.OK:
        patch_status = "verified"
    elif code == ExitCode.SUITE_UNVERIFIED:
        patch_status = "target_verified"
    elif code == ExitCode.NEEDS_REVIEW:
        patch_status = "needs_review"
    else:
        patch_status = "partial" if patch_text.strip() else "empty"
    backend = fix.get("backend") or None
    return {
        "schema_version": SCHEMA_VERSION,
        "status": STATUS[code],
        "exit_code": int(code),
        "message": message,
        "run_id": fix.get("run_id"),
        "version": __version__,
        "repo": str(repo),
        "starting_commit": starting_commit,
        "task": task,
        "target": target,
        "mode": fix.get("mode") or None,
        "selection": fix.get("target") or None,
        "tests": {phase: _tests(tests.get(phase)) for phase in PHASES},
        "suite_verdict": _suite_verdict(suite_after, regressions, unverified),
        "verdict": fix.get("verdict") or None,
        "still_failing": list(fix.get("still_failing") or []),
        "unverified": unverified,
        "weakened": list(fix.get("weakened") or []),
        "harness": list(fix.get("harness") or []),
        "tests_changed": list(fix.get("tests_changed") or []),
        "review": list(fix.get("review") or []),
        "regressions": regressions,
        "shown_by": list(fix.get("shown_by") or []),
        "files_changed": list(fix.get("files_changed") or []),
        "test_files_changed": list(fix.get("test_files_changed") or []),
        "left_out": dict(fix.get("left_out") or {}),
        "needs_yes": dict(fix.get("needs_yes") or {}),
        "patch": {
            "file": "patch.diff",
            "status": patch_status,
            "bytes": len(patch_text.encode("utf-8")),
            "apply": apply,
        },
        "agent": None
        if not agent
        else {"outcome": agent.get("outcome"), "summary": agent.get("summary") or ""},
        "blocked": ((agent or {}).get("blocked") or None) if code == ExitCode.BLOCKED else None,
        "steps": int((agent or {}).get("steps", 0)),
        "tokens": int((agent or {}).get("tokens", 0)),
        "elapsed_s": float(fix.get("elapsed_s", 0.0)),
        "backend": backend,
        "model": model_of(backend),
        "outputs": {
            "patch": "patch.diff",
            "result": RESULT_FILE,
            "summary": SUMMARY_MD,
            "trajectory": "trajectory.jsonl" if trajectory else None,
        },
    }


def model_of(backend: str | None) -> str | None:
    """The model a backend name says (``engine:NAME@cuda``, ``openai:NAME@host``); None for a
    replay (recorded turns, not a model) or no backend."""
    if not backend or backend.startswith("replay:"):
        return None
    return backend.partition(":")[2].rpartition("@")[0] or None


def _tests(counts: dict[str, Any] | None) -> dict[str, Any] | None:
    if counts is None:
        return None
    outcomes = counts.get("outcomes") or {}
    failing = [t for t, outcome in outcomes.items() if outcome in ("failed", "error")]
    return {
        "passed": int(counts.get("passed", 0)),
        "failed": int(counts.get("failed", 0)),
        "errors": int(counts.get("errors", 0)),
        "skipped": int(counts.get("skipped", 0)),
        "failing": failing[:FAILING_SHOWN],
    }


def _suite_verdict(suite_after: dict[str, Any] | None, regressions: list[str], unverified: list[str]) -> str:
    """not_run (no suite after the change), regressions, unverified (the workflow's verdict found
    the suite's runs no full check, or no test result came back), failing (tests that failed
    before fail still, nothing newly broken), passed."""
    if suite_after is None:
        return "not_run"
    if regressions:
        return "regressions"
    if unverified or not suite_after.get("outcomes"):
        return "unverified"
    if suite_after.get("failed") or suite_after.get("errors"):
        return "failing"
    return "passed"


def write_result(out: Path, result: dict[str, Any]) -> None:
    (out / RESULT_FILE).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / SUMMARY_MD).write_text(render_summary(result), encoding="utf-8")


HEADLINES = {
    "fixed": "FIXED",
    "fixed_suite_unverified": "FIXED, SUITE UNVERIFIED",
    "needs_review": "NEEDS REVIEW: the target passes, but how it passes needs a look",
    "not_fixed": "NOT FIXED",
    "nothing_to_fix": "NOTHING TO FIX",
    "budget_exhausted": "NOT FIXED: budget spent",
    "backend_unavailable": "NOT RUN: model backend unavailable",
    "sandbox_unavailable": "NOT RUN: sandbox unavailable",
    "usage_error": "NOT RUN: usage or configuration error",
    "blocked": "BLOCKED: a UserPromptSubmit hook kept the task from the model",
    "interrupted": "INTERRUPTED",
}


def render_summary(result: dict[str, Any]) -> str:
    """``summary.md``: what was wrong, what changed, the tests before and after."""
    tests = result["tests"]
    lines = [
        f"### clover-agent ci: {HEADLINES[result['status']]} (exit {result['exit_code']})",
        "",
        _fenced(result["message"]),
        "",
        "**What was wrong**",
        "",
    ]
    before = tests["target_before"]
    if result["mode"] == "request":
        lines.append("No test failed; the change is the one the request asks for:")
        lines += ["", _fenced(_clip(result["task"]["text"], 600))]
    elif before is not None:
        failing = before["failing"]
        lines.append(
            f"{before['failed'] + before['errors']} failing test(s): "
            + (", ".join(_code(t) for t in failing[:10]) or "(not named)")
            + (f" and {len(failing) - 10} more" if len(failing) > 10 else "")
        )
    else:
        lines.append("Not known: the run stopped before the tests ran.")
    lines += ["", "**What changed**", ""]
    if result["files_changed"]:
        lines.append(", ".join(_code(f) for f in result["files_changed"]))
        if result["test_files_changed"]:
            lines.append(
                f"(test files among them: {', '.join(_code(f) for f in result['test_files_changed'])})"
            )
    else:
        lines.append("No file.")
    for key, heading in (
        ("needs_yes", "Review these before applying the patch (a person's yes is needed for them):"),
        ("left_out", "Left out of the patch (never handed back, or not read):"),
    ):
        items = list(result[key].items())
        if items:
            lines += ["", heading, ""] + [f"- {_code(path)}: {_code(why)}" for path, why in items[:20]]
            lines += [f"- and {len(items) - 20} more (result.json's `{key}`)"] if len(items) > 20 else []
    if result["agent"] and result["agent"]["summary"]:
        lines += [
            "",
            "The agent's summary (its own words, not checked):",
            "",
            _fenced(result["agent"]["summary"]),
        ]
    if result["shown_by"]:
        lines += [
            "",
            "Shown by (fails without the change, passes with it): "
            + ", ".join(_code(t) for t in result["shown_by"]),
        ]
    lines += ["", "**Tests**", "", "| | before | after |", "| --- | --- | --- |"]
    lines.append(f"| target | {_counts(tests['target_before'])} | {_counts(tests['target_after'])} |")
    lines.append(f"| suite | {_counts(tests['suite_before'])} | {_counts(tests['suite_after'])} |")
    if tests["without_change"] is not None:
        lines.append(f"| new tests without the change | | {_counts(tests['without_change'])} |")
    if result["regressions"]:
        lines += ["", "Broken by the change: " + ", ".join(_code(t) for t in result["regressions"][:20])]
    if result["review"]:
        lines += ["", "Needs review (checks of how the target passes):", ""]
        lines += [f"- {_code(item)}" for item in result["review"][:20]]
        lines += (
            [f"- and {len(result['review']) - 20} more (result.json's `review`)"]
            if len(result["review"]) > 20
            else []
        )
    if result["weakened"]:
        lines += ["", "Tests weakened: " + "; ".join(_code(w) for w in result["weakened"][:10])]
    if result["harness"]:
        lines += [
            "",
            "Changes to what judges the patch: " + "; ".join(_code(h) for h in result["harness"][:10]),
        ]
    if result["unverified"]:
        lines += [
            "",
            "The suite is not fully checked: " + "; ".join(_code(u) for u in result["unverified"][:5]),
        ]
    if result["still_failing"]:
        lines += [
            "",
            "Failed before and still fail: " + ", ".join(_code(t) for t in result["still_failing"][:20]),
        ]
    patch = result["patch"]
    how = {
        "verified": "verified",
        "target_verified": "the target verified, the suite NOT",
        "needs_review": "NEEDS REVIEW before use",
        "partial": "partial, NOT verified",
        "empty": "empty",
    }[patch["status"]]
    lines += [
        "",
        f"Patch: `patch.diff` ({how}, {patch['bytes']:,} bytes); suite: {result['suite_verdict'].replace('_', ' ')}.",
        f"{result['steps']} steps, {result['tokens']:,} tokens, {result['elapsed_s']:.0f} s; backend "
        + (_code(result["backend"]) if result["backend"] else "none")
        + (" (replayed turns, not a model)" if (result["backend"] or "").startswith("replay:") else "")
        + f"; clover-agent {result['version']}.",
        "",
    ]
    return "\n".join(lines)


def _counts(counts: dict[str, Any] | None) -> str:
    if counts is None:
        return "not run"
    text = f"{counts['passed']} passed, {counts['failed']} failed"
    if counts["errors"]:
        text += f", {counts['errors']} errors"
    if counts["skipped"]:
        text += f", {counts['skipped']} skipped"
    return text


def _code(text: str) -> str:
    """``text`` as an inline code span on one line (its backticks made quotes): inert Markdown."""
    return "`" + " ".join(terminal_safe(text, single_line=True).replace("`", "'").split())[:300] + "`"


def _fenced(text: str) -> str:
    """``text`` in a fenced block longer than any run of backticks in it: inert Markdown."""
    text = terminal_safe(text.strip())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
