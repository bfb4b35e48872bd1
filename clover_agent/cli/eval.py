"""``clover-agent eval TASKS --output-dir OUT``: ``fix`` over a task set, graded like SWE-bench."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import sys
from collections.abc import Callable
from pathlib import Path

from clover_agent import __version__
from clover_agent.cli.options import (
    add_backend_arguments,
    add_budget_arguments,
    add_sandbox_arguments,
    backend_options,
    chosen_backend,
    positive,
    sandbox_kind,
)
from clover_agent.errors import CloverError, ExitCode, UsageError
from clover_agent.eval.gitsource import MIRROR_VARIABLE, TIMEOUT_VARIABLE, GitFetchOptions
from clover_agent.eval.harness import (
    PREDICTIONS_FILE,
    REPORT_JSON,
    REPORT_MD,
    EvalOptions,
    ordered_results,
    record_swebench_grades,
    run_tasks,
    write_outputs,
)
from clover_agent.eval.swebench import InstanceImages, has_spec, instance_spec, is_instance
from clover_agent.eval.swebench_grade import DEFAULT_NAMESPACE, GRADERS, check_tasks, grade_with_swebench
from clover_agent.eval.tasks import Task, load_tasks
from clover_agent.fix.regression import REGRESSION_SCOPES
from clover_agent.launch import backend_factory, check_backend_options, probe_backend
from clover_agent.safe_text import terminal_safe
from clover_agent.settings import Settings

EXIT_CODES = """\
exit codes:
  0  every task ran, and our verdict agrees with the grade on each (whatever the resolved rate)
  1  a task's verdict and grade disagree (a bug in one of them), a task could not be run
     (its repository or set-up failed) or graded, or (--grade swebench) our grade and
     swebench's differ: report.md lists them
  2  usage: bad arguments, or a task file that is not valid (the message names the file and field)
  3  model unavailable   4  sandbox unavailable (Docker missing: try --sandbox local)
  130 interrupted (Ctrl-C): the tasks finished so far are kept; run the same command to go on
Each finished task is kept in OUT/results/<id>.json; a second run over OUT skips those tasks."""


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a price is a finite number >= 0, not {text!r}")
    return value


def _prices(args: argparse.Namespace) -> tuple[float, float] | None:
    if (args.price_in is None) != (args.price_out is None):
        raise UsageError(
            "--price-in and --price-out go together (a cost from one price alone would be wrong)"
        )
    return None if args.price_in is None else (args.price_in, args.price_out)


def _instance_images(
    args: argparse.Namespace, tasks: list[Task], say: Callable[[str], None]
) -> InstanceImages | None:
    """Where instance images come from when the tasks run in them (``--swebench``, or every task
    a SWE-bench line swebench has a spec for); None: our own environments."""
    if args.swebench is None:
        if sandbox_kind(args) != "docker" or not all(has_spec(t) for t in tasks):
            return None
        say(
            "every task is a SWE-bench line: each runs in its instance image (--no-swebench: our own environments)"
        )
    if args.swebench is False:
        return None
    if args.swebench and sandbox_kind(args) != "docker":
        raise UsageError("--swebench runs each instance in its Docker image: leave out --sandbox local")
    if args.swebench and not any(is_instance(t) for t in tasks):
        raise UsageError(
            '--swebench: no task is a SWE-bench line (repo "owner/name", base_commit, version): '
            "the others run in our own environments"
        )
    unknown = [t for t in tasks if is_instance(t) and not has_spec(t)]
    if unknown:  # a usage error now, not one per task later
        instance_spec(unknown[0])
    namespace = None if args.swebench_namespace.lower() == "none" else args.swebench_namespace
    return InstanceImages(namespace=namespace, progress=say)


def _eval(args: argparse.Namespace) -> int:
    prices = _prices(args)
    skipped: list[str] = []

    def skip(message: str) -> None:
        skipped.append(message)
        print(terminal_safe(f"skipped: {message}"), file=sys.stderr)

    tasks = load_tasks(Path(args.tasks), on_skip=skip)
    if args.only:
        wanted = set(args.only)
        unknown = sorted(wanted - {t.instance_id for t in tasks})
        if unknown:
            raise UsageError(f"--only: no task {', '.join(unknown)} in {args.tasks}")
        tasks = [t for t in tasks if t.instance_id in wanted]
    if args.grade == "swebench":
        check_tasks(tasks, args.swebench_namespace)
    settings = Settings.load()
    git_fetch = GitFetchOptions.from_environment(
        settings.home, settings.environment, mirror=args.git_mirror, timeout_s=args.git_timeout
    )
    mode = "gold" if args.gold else "empty" if args.empty else "model"
    out = Path(args.output_dir)
    say = (lambda text: None) if args.quiet else (lambda text: print(terminal_safe(text), flush=True))
    make_backend, model_name = None, mode
    if mode == "model":
        options = check_backend_options(backend_options(args), settings)
        asyncio.run(probe_backend(options, settings))
        make_backend = backend_factory(options, settings)
        model_name = args.model_name or options.model_name or options.model or options.replay or options.kind
    elif chosen_backend(args) != "engine" or args.model or args.replay or args.base_url:
        raise UsageError(f"--{mode} runs its own replay: leave out the backend options")
    options_ = EvalOptions(
        output_dir=out,
        settings=settings,
        mode=mode,
        make_backend=make_backend,
        model_name=str(model_name),
        sandbox_kind=sandbox_kind(args),
        image=args.image,
        wheels=args.wheels,
        compiler=args.with_compiler,
        jobs=args.jobs,
        max_steps=args.max_steps,
        max_time_s=args.max_time,
        max_tokens=args.max_tokens,
        regression=args.regression,
        say=say,
        git=git_fetch,
        swebench=_instance_images(args, tasks, say),
    )
    meta = {
        "clover_agent": __version__,
        "mode": mode,
        "sandbox": options_.sandbox_kind,
        "machine": f"{platform.node()} ({platform.machine()}, {platform.system()})",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tasks_from": str(args.tasks),
        "skipped": skipped,
    }
    interrupted = False
    try:
        asyncio.run(run_tasks(tasks, options_))
        if args.grade == "swebench":
            say("grading with SWE-bench's harness (swebench.harness.run_evaluation)")
            grades = grade_with_swebench(
                tasks, ordered_results(tasks, out), out, workers=args.jobs, namespace=args.swebench_namespace
            )
            record_swebench_grades(out, {key: g.to_dict() for key, g in grades.items()})
    except KeyboardInterrupt:
        interrupted = True
    summary = write_outputs(tasks, out, options_.model_name, meta, prices, grader=args.grade)
    print(
        f"resolved {summary['resolved']} of {summary['tasks']} ({100 * summary['resolved_rate']:.1f}%), "
        f"{len(summary['disagreements'])} disagreement(s), {len(summary['errors'])} error(s); "
        f"{out / PREDICTIONS_FILE}, {out / REPORT_JSON}, {out / REPORT_MD}"
    )
    if interrupted:
        raise CloverError(
            f"interrupted: {summary['done']} of {summary['tasks']} task(s) done and kept in {out}; "
            "run the same command to go on",
            exit_code=ExitCode.INTERRUPTED,
        )
    if summary["disagreements"] or summary["errors"] or summary["grader_disagreements"]:
        print(
            terminal_safe(
                f"disagreements: {', '.join(summary['disagreements']) or 'none'}; "
                f"errors: {', '.join(summary['errors']) or 'none'}"
                + (
                    f"; ours and swebench's grade differ on {', '.join(summary['grader_disagreements'])}"
                    if summary["grader_disagreements"]
                    else ""
                )
            ),
            file=sys.stderr,
        )
        return int(ExitCode.FAILURE)
    return int(ExitCode.OK)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="run fix over a task set of real bugs and grade it like SWE-bench",
        description="For each task of TASKS (a folder of task folders, one task folder, or a file of\n"
        "tasks: JSON Lines, a JSON list, parquet, as SWE-bench publishes them; docs/eval.md), run `fix` in its own sandbox on the repository with the task's tests\n"
        "added, then grade its patch in a fresh sandbox with the held-out test patch applied over\n"
        "it: FAIL_TO_PASS must pass, PASS_TO_PASS must keep passing. Writes OUT/predictions.jsonl\n"
        "(the swebench format), OUT/report.json and OUT/report.md.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "tasks", metavar="TASKS", help="the task set (e.g. bench/tasks, or a SWE-bench .jsonl/.json/.parquet)"
    )
    p.add_argument("--output-dir", required=True, metavar="OUT", help="where results and reports go")
    add_backend_arguments(p)
    add_sandbox_arguments(p)
    add_budget_arguments(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--gold", action="store_true", help="a replay that makes each task's gold patch (checks the harness)"
    )
    which.add_argument(
        "--empty", action="store_true", help="a replay that changes nothing (must resolve 0%%)"
    )
    p.add_argument("--jobs", type=positive(int), default=1, metavar="N", help="tasks at a time (default 1)")
    p.add_argument("--only", nargs="+", metavar="ID", help="only these tasks of the set")
    p.add_argument(
        "--regression",
        choices=REGRESSION_SCOPES,
        default="suite",
        help="what fix's regression runs cover (default suite)",
    )
    for side in ("in", "out"):
        p.add_argument(
            f"--price-{side}",
            type=_price,
            metavar="USD",
            help=f"price of a million {side}put tokens: adds each task's cost and the cost per resolved task",
        )
    p.add_argument(
        "--git-mirror",
        metavar="DIR",
        help="read https git sources from DIR/owner/name.git (made with `git clone --mirror URL "
        f"DIR/owner/name.git`) instead of the network; also {MIRROR_VARIABLE}",
    )
    p.add_argument(
        "--git-timeout",
        type=positive(float),
        metavar="S",
        help=f"seconds a git source's fetch may take (default 1800; also {TIMEOUT_VARIABLE})",
    )
    p.add_argument(
        "--grade",
        choices=GRADERS,
        default="ours",
        help="whose grade decides `resolved`: ours (default), or swebench: SWE-bench's own harness "
        "(the swebench package, 4.x) runs each instance's image and eval script over the patches, "
        "--jobs at a time, in OUT/swebench; ours still runs, and where the two differ it is listed",
    )
    p.add_argument(
        "--swebench-namespace",
        default=DEFAULT_NAMESPACE,
        metavar="NS",
        help=f"--swebench and --grade swebench: where the instance images come from (default "
        f"{DEFAULT_NAMESPACE}: SWE-bench's published images, pulled where not here; none: the local "
        "images under swebench's names, built by the swebench package where missing)",
    )
    p.add_argument(
        "--swebench",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each SWE-bench instance in its instance image (/testbed the workspace; the eval "
        "script, test command and log parser of the swebench package; images from "
        "--swebench-namespace, or local with `none`); default: when every task is a SWE-bench "
        "line swebench has a spec for; --no-swebench: our own environments",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines, only the summary")
    p.set_defaults(func=_eval)
