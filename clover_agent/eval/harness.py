"""Running a task set: per task, ``fix`` in its own sandbox on the released tree with the task's
tests added (the target: FAIL_TO_PASS; the request: the problem statement), then the grade in a
fresh sandbox. Each finished task is kept in ``OUT/results/<id>.json`` at once, so an eval stopped
at any point (Ctrl-C) keeps what it did and a second run over ``OUT`` skips those tasks (those
that could not be run are tried again); the
predictions and the reports are written from those files."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.agent.policy import preset
from clover_agent.backends.base import ModelBackend
from clover_agent.backends.replay import ReplayBackend
from clover_agent.errors import RUN_ERRORS, message_of
from clover_agent.eval.gitsource import GitFetchOptions
from clover_agent.eval.grade import Grade, grade
from clover_agent.eval.scripts import empty_turns, gold_turns, write_replay
from clover_agent.eval.source import commit_all, make_repo
from clover_agent.eval.swebench import (
    InstanceEnvironment,
    InstanceImages,
    grade_instance,
    instance_test_command,
    is_instance,
    open_instance,
)
from clover_agent.eval.tasks import Task
from clover_agent.events import Event, EventBus, ModelResponded, PhaseStarted
from clover_agent.fix.request import FixRequest
from clover_agent.fix.workflow import run_fix
from clover_agent.handback.hostgit import git
from clover_agent.launch import sandbox_spec
from clover_agent.protocol import FORMAT_REMINDER
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.session.assembly import SessionConfig
from clover_agent.settings import RepoSettings, Settings, host_package_index

RESULTS_DIR = "results"
WORK_DIR = "work"
PREDICTIONS_FILE = "predictions.jsonl"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
MODES = ("model", "gold", "empty")


@dataclass
class EvalOptions:
    output_dir: Path
    settings: Settings
    mode: str = "model"  # model: make_backend; gold / empty: the generated replays
    make_backend: Callable[[], ModelBackend] | None = None
    model_name: str = ""  # predictions' model_name_or_path
    sandbox_kind: str = "docker"
    image: str | None = None
    wheels: str | None = None
    compiler: bool = False  # --with-compiler: the image's compiler variant
    jobs: int = 1
    max_steps: int | None = 50
    max_time_s: float | None = 1800.0
    max_tokens: int | None = None
    regression: str = "suite"
    say: Callable[[str], None] = field(default=lambda text: None)
    #: Where git sources are cached and mirrored, their timeout (None: from the settings).
    git: GitFetchOptions | None = None
    #: SWE-bench instances run in their instance images (``--swebench``), from where these say;
    #: None: every task in its environment of ours.
    swebench: InstanceImages | None = None


def results_dir(out: Path) -> Path:
    return out / RESULTS_DIR


def done_results(out: Path) -> dict[str, dict[str, Any]]:
    """The tasks finished in ``out`` (a result file that cannot be read counts as not done)."""
    found: dict[str, dict[str, Any]] = {}
    folder = results_dir(out)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("instance_id") == path.stem:
            found[path.stem] = data
    return found


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


class _Counter:
    """Tokens in and out over a task's model calls, and its phases shown as they start."""

    def __init__(self, task_id: str, say: Callable[[str], None]) -> None:
        self.task_id, self.say = task_id, say
        self.tokens_in = self.tokens_out = self.calls = 0
        self.model_s = 0.0  # the model calls' own time, summed
        self.broken: list[str] = []  # each unusable tool call's reason, as the model was told
        self.no_call = 0  # turns with neither a tool call nor a broken one

    def reasons(self) -> list[str]:
        """The distinct reasons, most frequent first, each once with its count: at most
        ``MAX_REASONS`` of them, each cut to ``MAX_REASON_CHARS``."""
        counts: dict[str, int] = {}
        for reason in self.broken:
            counts[reason] = counts.get(reason, 0) + 1
        ranked = sorted(counts.items(), key=lambda item: -item[1])[:MAX_REASONS]
        return [reason if n == 1 else f"{reason} (x{n})" for reason, n in ranked]

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelResponded):
            self.calls += 1
            self.tokens_in += event.prompt_tokens
            self.tokens_out += event.completion_tokens
            self.model_s += event.seconds
            if event.format_error is not None:
                self.broken += problems_of(event.format_error)
            elif not event.tool_calls:
                self.no_call += 1
        elif isinstance(event, PhaseStarted):
            self.say(f"  {self.task_id}: {event.phase}: {event.detail}")


#: How many distinct broken-call reasons a task's result keeps, and how long each may be.
MAX_REASONS = 8
MAX_REASON_CHARS = 160


def problems_of(format_error: str) -> list[str]:
    """One reason per unusable call from the message the model got back (its ``- `` lines,
    before the format reminder); a message of another shape is one reason, its first line."""
    body = format_error.split(FORMAT_REMINDER, 1)[0].splitlines()[1:]
    listed = [line[2:].strip() for line in body if line.startswith("- ")]
    first = (format_error.strip().splitlines() or ["(no message)"])[0]
    return [_short(p) for p in listed or [first]]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


async def run_tasks(tasks: list[Task], options: EvalOptions) -> list[dict[str, Any]]:
    """Every task not done in the output folder, ``options.jobs`` at a time; returns the results
    of the whole set (done before and now) in task order."""
    out = options.output_dir
    done = done_results(out)
    # a task that could not be run (its set-up failed) is tried again
    todo = [t for t in tasks if t.instance_id not in done or done[t.instance_id].get("error")]
    if len(todo) < len(tasks):
        options.say(f"{len(tasks) - len(todo)} of {len(tasks)} task(s) already done in {out}: skipped")
    gate = asyncio.Semaphore(max(1, options.jobs))
    finished = len(tasks) - len(todo)

    async def one(task: Task) -> None:
        nonlocal finished
        async with gate:
            options.say(f"[{finished + 1}/{len(tasks)}] {task.instance_id}: starting")
            result = await run_task(task, options)
            _write_json(results_dir(out) / f"{task.instance_id}.json", result)
            finished += 1
            options.say(f"[{finished}/{len(tasks)}] {task.instance_id}: {describe(result)}")

    await asyncio.gather(*(one(t) for t in todo))
    return ordered_results(tasks, out)


def record_swebench_grades(out: Path, grades: dict[str, dict[str, Any]]) -> None:
    """Keeps swebench's grade of each task in its result file (``swebench``), beside ours."""
    done = done_results(out)
    for task_id, graded in grades.items():
        if task_id in done:
            _write_json(results_dir(out) / f"{task_id}.json", {**done[task_id], "swebench": graded})


def ordered_results(tasks: list[Task], out: Path) -> list[dict[str, Any]]:
    done = done_results(out)
    return [done[t.instance_id] for t in tasks if t.instance_id in done]


def describe(result: dict[str, Any]) -> str:
    if result.get("error"):
        return f"error: {result['error']}"
    grade_text = "RESOLVED" if result["resolved"] else "unresolved"
    agree = "" if result["agree"] else "  DISAGREES"
    return (
        f"verdict {result['verdict'] or '-'} (exit {result['exit_code']}), {grade_text}{agree}, "
        f"{result['steps']} step(s), {result['wall_s']:.1f}s"
    )


def task_spec(options: EvalOptions, repo: Path, task: Task) -> SandboxSpec:
    """The sandbox spec of a task's repository: its environment and set-up (in Docker) over the
    options' image, wheels and compiler choice, as the fix and the grade start it."""
    return sandbox_spec(
        options.settings,
        repo,
        image=options.image,
        environment=options.sandbox_kind == "docker",
        wheels=options.wheels,
        compiler=options.compiler,
        repo_config=_repo_config(task),
    )


def _repo_config(task: Task) -> RepoSettings:
    """The task's set-up as the repository's trusted settings would give it."""
    env = task.environment

    def listed(key: str) -> tuple[str, ...] | None:
        return tuple(env[key]) if key in env else None

    return RepoSettings(
        setup=list(task.setup),
        install_project=env.get("install_project"),
        requirements=listed("requirements"),
        extras=listed("extras"),
        packages=listed("packages") or (),
    )


#: fix's exit codes that say the task could not be run (its environment, its tests), not how the
#: agent did: usage (the tests select nothing), sandbox unavailable, nothing to fix.
TASK_BROKEN = (2, 4, 5)


def _request(task: Task, instance: InstanceEnvironment | None = None) -> str:
    text = (
        f"An issue was reported against this repository:\n\n{task.problem_statement.strip()}\n\n"
        "Tests that show it were added; make them pass by fixing the code."
    )
    if instance is not None:  # the workspace is the instance's /testbed
        text += (
            f"\n\nThe project's own test command, run in /testbed: `{instance_test_command(instance.spec)}`."
        )
    return text


def git_options(settings: Settings, chosen: GitFetchOptions | None = None) -> GitFetchOptions:
    """``chosen``, else the git options of the settings (the cache under ``CLOVER_HOME``, the
    mirror and timeout variables of their environment)."""
    return chosen or GitFetchOptions.from_environment(settings.home, settings.environment)


def prepare_repo(
    task: Task, work: Path, settings: Settings, git_fetch: GitFetchOptions | None = None
) -> tuple[Path, Path]:
    """``work/base``, the task's repository as released (made once, kept for the grade), and
    ``work/repo``, a fresh copy of it with the test patch committed: the tree fix runs on."""
    base = work / "base"
    if not (base / ".git").is_dir():
        shutil.rmtree(base, ignore_errors=True)
        make_repo(task.repo, base, host_package_index(settings.environment), git_options(settings, git_fetch))
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(base, repo, symlinks=True)
    git(repo, "apply", "--whitespace=nowarn", "-", input=task.test_patch.encode())
    commit_all(repo, f"{task.instance_id}: the tests that show the bug")
    return base, repo


async def run_task(task: Task, options: EvalOptions) -> dict[str, Any]:
    """One task, fix then grade; every failure of a step ends up in the result, never raised."""
    started = time.monotonic()
    work = options.output_dir / WORK_DIR / task.instance_id
    result: dict[str, Any] = {
        "instance_id": task.instance_id,
        "model_name_or_path": options.model_name,
        "model_patch": "",
        "verdict": "",
        "fixed": False,
        "exit_code": None,
        "message": "",
        "resolved": False,
        "grade": None,
        "agree": True,
        "steps": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "model_s": 0.0,
        "agent_s": 0.0,
        "tokens_per_s": None,
        "tokens_per_s_over": "",
        "broken_tool_calls": 0,
        "broken_tool_call_reasons": [],
        "turns_without_tool_call": 0,
        "wall_s": 0.0,
        "error": "",
        "source": task.source,
    }
    try:
        if task.unrunnable:
            result.update(error=f"the task could not be run: {task.unrunnable}")
            result["wall_s"] = round(time.monotonic() - started, 3)
            return result
        instance = None
        if options.swebench is not None and is_instance(task):
            instance = await asyncio.to_thread(
                open_instance, task, options.swebench, options.settings, work / "base"
            )
        base, repo = prepare_repo(task, work, options.settings, options.git)
        shutil.rmtree(work / "run", ignore_errors=True)

        def spec_of(tree: Path) -> SandboxSpec:
            if instance is not None:
                return instance.sandbox_spec(options.settings, tree)
            return task_spec(options, tree, task)

        make_backend = _backend(task, options, repo, work)
        counter = _Counter(task.instance_id, options.say)
        bus = EventBus()
        bus.subscribe(counter)
        session = SessionConfig(
            repo=repo,
            make_backend=make_backend,
            spec=spec_of(repo),
            sandbox_kind=options.sandbox_kind,
            policy=preset("ci"),
            # a replay ends by itself, however many turns its patch takes
            max_steps=options.max_steps if options.mode == "model" else None,
            max_time_s=options.max_time_s,
            max_tokens=options.max_tokens,
        )
        request = FixRequest(
            target=" ".join(task.fail_to_pass),
            session=session,
            run_dir=work / "run",
            command="eval",
            regression=options.regression,
            request=_request(task, instance),
            launch={"eval": options.mode, "instance_id": task.instance_id},
        )
        report = await run_fix(request, bus)
        patch = (
            report.patch_path.read_text(encoding="utf-8", errors="surrogateescape")
            if report.patch_path.is_file()
            else ""
        )
        result.update(
            model_patch=patch,
            verdict="" if report.verdict is None else report.verdict.value,
            fixed=report.fixed,
            exit_code=int(report.exit_code),
            message=report.message,
            steps=int((report.agent.stats if report.agent else {}).get("steps", 0)),
            tokens_in=counter.tokens_in,
            tokens_out=counter.tokens_out,
            model_s=round(counter.model_s, 3),
            agent_s=float((report.agent.stats if report.agent else {}).get("elapsed_s", 0.0)),
            broken_tool_calls=len(counter.broken),
            broken_tool_call_reasons=counter.reasons(),
            turns_without_tool_call=counter.no_call,
        )
        result.update(_speed(result))
        if report.verdict is None and int(report.exit_code) in TASK_BROKEN:
            result["error"] = f"the task could not be run (exit {int(report.exit_code)}): " + (
                report.message.splitlines()[0] if report.message else ""
            )
        if instance is not None:
            graded: Grade = await grade_instance(
                task, instance.spec, base, work / "grade", patch, spec_of, options.sandbox_kind
            )
        else:
            graded = await grade(task, base, work / "grade", patch, spec_of, options.sandbox_kind)
        result.update(resolved=graded.resolved, grade=graded.to_dict(), agree=graded.resolved == report.fixed)
    except RUN_ERRORS as exc:
        result.update(error=message_of(exc), agree=not result["fixed"])
    except OSError as exc:
        result.update(error=f"{type(exc).__name__}: {exc}", agree=not result["fixed"])
    result["wall_s"] = round(time.monotonic() - started, 3)
    return result


#: Model calls that took less than this in all are not timed generation (a replay's turns are read
#: in microseconds, which made millions of tokens a second): their rate is over the agent's time.
MEASURABLE_MODEL_S = 0.1


def _speed(result: dict[str, Any]) -> dict[str, Any]:
    """Output tokens per second over the model calls' own time (``generation``), or over the
    agent's wall time where the calls took no measurable time (``agent``); None with neither."""
    tokens = int(result["tokens_out"])
    model_s, agent_s = float(result["model_s"]), float(result["agent_s"])
    for over, seconds in (
        ("generation", model_s if model_s >= MEASURABLE_MODEL_S else 0.0),
        ("agent", agent_s),
    ):
        if seconds > 0:
            return {"tokens_per_s": round(tokens / seconds, 2), "tokens_per_s_over": over}
    return {"tokens_per_s": None, "tokens_per_s_over": ""}


def task_cost(result: dict[str, Any], price_in: float, price_out: float) -> float:
    """What a task's tokens cost at these prices (each per million tokens)."""
    return (int(result["tokens_in"]) * price_in + int(result["tokens_out"]) * price_out) / 1_000_000


def _backend(task: Task, options: EvalOptions, repo: Path, work: Path) -> Callable[[], ModelBackend]:
    if options.mode == "gold":
        path = write_replay(
            work / "gold.replay.jsonl", gold_turns(repo, task.patch, " ".join(task.fail_to_pass))
        )
        return lambda: ReplayBackend(path)
    if options.mode == "empty":
        path = write_replay(work / "empty.replay.jsonl", empty_turns())
        return lambda: ReplayBackend(path)
    assert options.make_backend is not None
    return options.make_backend


def write_outputs(
    tasks: list[Task],
    out: Path,
    model_name: str,
    meta: dict[str, Any],
    prices: tuple[float, float] | None = None,
    grader: str = "ours",
) -> dict[str, Any]:
    """predictions.jsonl, report.json and report.md from the results in ``out``; ``prices``
    (in, out; per million tokens) adds each task's cost and the cost per resolved task. ``grader``
    says whose grade is ``resolved``: ours, or swebench's (each result's ``swebench``, from
    :func:`clover_agent.eval.swebench_grade.grade_with_swebench`); where both graded a task and
    they differ, the task is listed in ``grader_disagreements``."""
    results = [dict(r) for r in ordered_results(tasks, out)]
    for r in results:
        r["cost"] = None if prices is None else round(task_cost(r, *prices), 6)
        if grader == "swebench":
            _take_swebench_grade(r)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / PREDICTIONS_FILE, "w", encoding="utf-8") as f:
        for r in results:
            f.write(
                json.dumps(
                    {
                        "instance_id": r["instance_id"],
                        "model_name_or_path": r.get("model_name_or_path") or model_name,
                        "model_patch": r["model_patch"],
                    }
                )
                + "\n"
            )
    resolved = [r["instance_id"] for r in results if r["resolved"]]
    disagree = [r["instance_id"] for r in results if not r["agree"]]
    summary = {
        **meta,
        "model_name_or_path": model_name,
        "grader": grader,
        "grader_disagreements": [
            r["instance_id"]
            for r in results
            if r.get("grade")
            and r.get("swebench")
            and r["swebench"]["status"] in ("resolved", "unresolved")
            and r["grade"]["resolved"] != r["swebench"]["resolved"]
        ],
        "tasks": len(tasks),
        "done": len(results),
        "resolved": len(resolved),
        "resolved_rate": round(len(resolved) / len(tasks), 4) if tasks else 0.0,
        "resolved_ids": resolved,
        "disagreements": disagree,
        "errors": [r["instance_id"] for r in results if r.get("error")],
        "price_in_per_mtok": None if prices is None else prices[0],
        "price_out_per_mtok": None if prices is None else prices[1],
        "cost": None if prices is None else round(sum(r["cost"] for r in results), 6),
        "cost_per_resolved": (
            round(sum(r["cost"] for r in results) / len(resolved), 6)
            if prices is not None and resolved
            else None
        ),
        "not_done": [
            t.instance_id for t in tasks if t.instance_id not in {r["instance_id"] for r in results}
        ],
        "results": [{k: v for k, v in r.items() if k != "model_patch"} for r in results],
    }
    _write_json(out / REPORT_JSON, summary)
    (out / REPORT_MD).write_text(markdown(summary), encoding="utf-8")
    return summary


def _take_swebench_grade(result: dict[str, Any]) -> None:
    """A result (a copy) as swebench graded it: its ``resolved`` and ``agree`` from swebench's
    grade; an instance swebench could not grade (or did not: the eval stopped before) is an error."""
    theirs = result.get("swebench")
    result["resolved"] = bool(theirs and theirs["resolved"])
    result["agree"] = result["resolved"] == result["fixed"]
    if result.get("error"):
        return
    if not theirs:
        result["error"] = "not graded by swebench (the eval stopped before its grading)"
    elif theirs["status"] == "error":
        result["error"] = f"swebench could not grade it: {theirs['message']}"


def markdown(summary: dict[str, Any]) -> str:
    rate = 100 * summary["resolved_rate"]
    lines = [
        f"# eval: {summary['model_name_or_path']}",
        "",
        f"Resolved {summary['resolved']} of {summary['tasks']} ({rate:.1f}%); {summary['done']} done; "
        f"{len(summary['disagreements'])} verdict/grade disagreement(s); {len(summary['errors'])} error(s).",
        "",
        _grader_line(summary),
        "",
        f"Cost: {_money(summary.get('cost'))} in all, {_money(summary.get('cost_per_resolved'))} per resolved "
        f"task ({_prices(summary)}).",
        "",
        "tokens/s: output tokens over the model calls' own time (gen), or over the agent's wall time "
        "(agent) where the calls took no measurable time (under 0.1 s in all: a replay); wall s is the whole task, grading included.",
        "",
        "broken calls: tool calls that could not be used (unreadable, unknown tool, arguments the "
        "schema rejects), listed below; no call: turns with no tool call at all.",
        "",
        "| task | verdict | exit | grade | agrees | steps | broken calls | no call | tokens in | tokens out "
        "| tokens/s | cost | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary["results"]:
        grade_text = "error" if r.get("error") else ("resolved" if r["resolved"] else "unresolved")
        lines.append(
            f"| {r['instance_id']} | {r['verdict'] or '-'} | {r['exit_code']} | {grade_text} | "
            f"{'yes' if r['agree'] else '**no**'} | {r['steps']} | {r.get('broken_tool_calls', 0)} | "
            f"{r.get('turns_without_tool_call', 0)} | {r['tokens_in']} | {r['tokens_out']} | "
            f"{_rate(r)} | {_money(r.get('cost'))} | {r['wall_s']:.1f} |"
        )
    broken = [r for r in summary["results"] if r.get("broken_tool_calls")]
    if broken:
        lines += ["", "Broken tool calls (why each could not be used):", ""]
        for r in broken:
            reasons = "; ".join(_cell(reason) for reason in r.get("broken_tool_call_reasons", []))
            lines.append(f"- {r['instance_id']} ({r['broken_tool_calls']}): {reasons}")
    if summary["disagreements"]:
        lines += ["", "Disagreements (a bug in the verdict or in the grade):", ""]
        by_id = {r["instance_id"]: r for r in summary["results"]}
        for task_id in summary["disagreements"]:
            r = by_id[task_id]
            graded = r.get("swebench") if summary.get("grader") == "swebench" else r.get("grade")
            why = graded["message"] if graded else r.get("error", "")
            lines.append(f"- {task_id}: verdict {r['verdict'] or '-'} ({r['message']}); grade: {why}")
    if summary.get("grader_disagreements"):
        lines += ["", "Grader disagreements (ours and swebench's differ: a bug in one of them):", ""]
        by_id = {r["instance_id"]: r for r in summary["results"]}
        for task_id in summary["grader_disagreements"]:
            r = by_id[task_id]
            lines.append(f"- {task_id}: ours: {r['grade']['message']}; swebench: {r['swebench']['message']}")
    if summary["errors"]:
        lines += ["", "Errors:", ""]
        lines += [f"- {r['instance_id']}: {r['error']}" for r in summary["results"] if r.get("error")]
    if summary.get("skipped"):
        lines += ["", "Skipped (tasks of the file that could not be loaded):", ""]
        lines += [f"- {_cell(why)}" for why in summary["skipped"]]
    return "\n".join(lines) + "\n"


def _grader_line(summary: dict[str, Any]) -> str:
    if summary.get("grader") != "swebench":
        return "Graded by clover-agent's grader (a fresh sandbox, the held-out tests applied over the patch)."
    return (
        "Graded by SWE-bench's harness (swebench.harness.run_evaluation, each instance's image and eval "
        f"script; OUT/swebench); {len(summary.get('grader_disagreements', []))} task(s) where our own "
        "grade differs."
    )


def _cell(text: str) -> str:
    """Model-written text made safe for one Markdown line."""
    return text.replace("|", "\\|").replace("`", "'")


def _money(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


def _prices(summary: dict[str, Any]) -> str:
    if summary.get("price_in_per_mtok") is None:
        return "no price given: --price-in/--price-out"
    return f"${summary['price_in_per_mtok']} in, ${summary['price_out_per_mtok']} out per million tokens"


def _rate(r: dict[str, Any]) -> str:
    if r.get("tokens_per_s") is None:
        return "—"
    return f"{r['tokens_per_s']:.1f} ({'gen' if r['tokens_per_s_over'] == 'generation' else 'agent'})"


def replace_options(options: EvalOptions, **changes: Any) -> EvalOptions:
    return dataclasses.replace(options, **changes)
