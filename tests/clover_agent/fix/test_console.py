"""The console renderer and the run's figures: model text streams line by line, tool-call markup
never shows, thinking is labelled (one line a turn unless verbose), results are trimmed, errors
that end a run are left to the command, the figures count a call cut off mid-way, and a running
command's status line says the last line it printed, sanitised."""

from __future__ import annotations

import io
import re

import pytest

from clover_agent.events import (
    Done,
    ErrorReported,
    EventBus,
    ModelCallStarted,
    ModelDelta,
    ModelResponded,
    PhaseStarted,
    ProvisionalBlock,
    RunStarted,
    TaskFinished,
    TaskStarted,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutput,
)
from clover_agent.fix.console import ConsoleRenderer, make_console
from clover_agent.fix.progress import RunFigures

CALL = "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
SGR = re.compile(r"\x1b\[[0-9;]*m")


def responded(content: str = "", *, step: int = 1, reasoning: str | None = None, **more) -> ModelResponded:
    fields = dict(step=step, raw="", content=content, reasoning=reasoning, tool_calls=[], format_error=None,
                  prompt_tokens=1, completion_tokens=1, finish_reason="stop")  # fmt: skip
    return ModelResponded(**{**fields, **more})


def plain(**options) -> tuple[io.StringIO, ConsoleRenderer]:
    out = io.StringIO()
    return out, ConsoleRenderer(make_console(out, environ={}), **options)


def test_streamed_text_stops_at_the_tool_call_even_when_the_tag_is_split() -> None:
    out, render = plain()
    text = "Listing the files.\n\n" + CALL
    render(ModelDelta(step=1, kind="reasoning", text="hidden thoughts\nand more of them\n"))
    for i in range(0, len(text), 3):  # deltas that cut "<tool_call>" in pieces
        render(ModelDelta(step=1, kind="text", text=text[i : i + 3]))
    render(responded())
    render(ToolCallStarted(step=1, call_id="c", name="shell", arguments={"command": "ls"}))
    render(
        ToolCallFinished(
            step=1, call_id="c", name="shell", output="\n".join(f"f{i}" for i in range(30)), is_error=False
        )
    )
    render(Done(outcome="submitted", exit_code=0, message="m", summary="all done"))
    shown = out.getvalue()
    assert shown.startswith(
        "thinking │ hidden thoughts (+1 lines; -v shows them)\nListing the files.\n  step 1:"
    )  # the thinking folded to its first line; no blank line before the call
    assert "\n→ shell command=ls\n" in shown
    assert "<tool" not in shown and "and more of them" not in shown
    assert "  ✓ f0\n" in shown and "f7" in shown and "f8\n" not in shown and "… 22 more lines" in shown
    assert shown.endswith("finished: all done\n")
    assert not SGR.search(shown)  # not a terminal: plain text


def test_unstreamed_content_is_printed_once_and_thinking_whole_when_verbose() -> None:
    out, render = plain(verbose=True)
    render(ModelDelta(step=1, kind="reasoning", text="thinking it over\n\nstill"))
    render(responded("visible"))
    render(responded("second turn", step=2, reasoning="unstreamed thought"))
    render(ModelDelta(step=3, kind="reasoning", text="more thoughts"))
    render(ModelDelta(step=3, kind="text", text="Answer."))
    render(responded("Answer.", step=3))
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("  step ")]
    assert lines == [
        "thinking │ thinking it over",
        "thinking │ ",
        "thinking │ still",
        "visible",
        "thinking │ unstreamed thought",
        "second turn",
        "thinking │ more thoughts",
        "Answer.",
    ]


def test_errors_that_end_the_run_are_left_to_the_command_and_quiet_says_nothing() -> None:
    out, render = plain()
    render(ErrorReported(kind="budget_exhausted", message="step budget exhausted", fatal=True, exit_code=6))
    render(Done(outcome="budget_exhausted", exit_code=6, message="step budget exhausted"))
    render(ErrorReported(kind="format", message="the call is not closed"))
    assert "budget" not in out.getvalue() and "  ! format: the call is not closed\n" in out.getvalue()
    out, render = plain(quiet=True)
    for event in (
        TaskStarted(run_id="r", command="fix", target="t", repo="/r", sandbox="local"),
        responded("x"),
    ):
        render(event)
    assert out.getvalue() == ""


def test_colour_follows_the_terminal_and_no_color() -> None:
    def styled(environ: dict[str, str]) -> str:
        out = io.StringIO()
        # FORCE_COLOR: styles as at a terminal (a real one: the pseudo-terminal tests of fix).
        ConsoleRenderer(make_console(out, environ={"FORCE_COLOR": "1", **environ}))(
            ToolCallStarted(step=1, call_id="c", name="shell", arguments={"command": "ls"})
        )
        return out.getvalue()

    assert SGR.search(styled({"TERM": "xterm-256color"}))
    assert not SGR.search(styled({"TERM": "xterm-256color", "NO_COLOR": "1"}))
    assert SGR.search(styled({"TERM": "xterm-256color", "NO_COLOR": ""}))  # set but empty: not set
    # Not a terminal (a StringIO), and an empty FORCE_COLOR forces nothing: plain.
    assert not SGR.search(styled({"TERM": "xterm-256color", "FORCE_COLOR": ""}))


def test_figures_count_a_call_cut_off_mid_way() -> None:
    """A run stopped while the model wrote (a time budget, Ctrl-C) still has a step and tokens."""
    figures = RunFigures()
    figures(RunStarted(run_id="r", task="t", backend="engine:tiny", limits={"max_steps": 50}))
    figures(ModelCallStarted(step=1, prompt_tokens=1000, prompt_messages=2))
    figures(responded("x", prompt_tokens=1000, completion_tokens=64, forwards=20, seconds=2.0))
    figures(ModelCallStarted(step=2, prompt_tokens=1100, prompt_messages=4))
    for _ in range(6):  # six blocks written, then the run is stopped
        figures(ProvisionalBlock(step=2, block=0, position=0, denoise_step=1, token_ids=[], filled=[],
                                 newly_filled=[], text=""))  # fmt: skip
        figures(ModelDelta(step=2, kind="text", text="x" * 35))
    assert figures.status().startswith("model writing (") and "step 2/50" in figures.status()
    figures(TaskFinished(run_id="r", command="fix", exit_code=6, message="time budget exhausted"))
    final = figures.final()
    assert final.startswith("2 model calls, 1 cut off; 2,100 tokens in, 124 out")  # 64 + 60 estimated
    assert "tokens per forward" in final


def test_a_running_command_shows_its_last_line_in_the_status() -> None:
    bus = EventBus()
    figures = RunFigures()
    bus.subscribe(figures)  # as `fix` does: the figures first, then the renderer
    renderer = ConsoleRenderer(make_console(io.StringIO(), environ={}), figures=figures)
    bus.subscribe(renderer)
    bus.emit(ToolCallStarted(step=1, call_id="c1", name="shell", arguments={"command": "make"}))
    assert figures.status().startswith("running shell (")
    bus.emit(ToolOutput(step=1, call_id="c1", name="shell", text="compiling a.c\ncompiling b"))
    bus.emit(ToolOutput(step=1, call_id="c1", name="shell", text=".c \x1b[2J\x1b]0;title\x07\n\n"))
    assert figures.status().startswith("running shell: compiling b.c \x1b[2J")
    area = io.StringIO()
    make_console(area, environ={"COLUMNS": "200"}).print(renderer)  # the live area, as rich draws it
    drawn = area.getvalue()
    assert "compiling b.c \\x1b[2J\\x1b]0;title\\x07" in drawn and "\x1b" not in drawn
    bus.emit(ToolCallFinished(step=1, call_id="c1", name="shell", output="ok", is_error=False))
    assert "compiling" not in figures.status()


@pytest.mark.parametrize(
    ("launch", "limit"),
    [({"suite_timeout": 600}, "2 min 00 s"), ({"suite_timeout": 600, "test_timeout": 30}, "30.0 s")],
)
def test_a_test_run_past_one_tests_limit_says_it_is_running_long(launch: dict, limit: str) -> None:
    figures = RunFigures()
    figures(TaskStarted(run_id="r", command="fix", target="t", repo="/r", sandbox="docker", launch=launch))
    figures(PhaseStarted(phase="tests before", detail="the regression baseline: the whole suite"))
    assert "running long" not in figures.status(now=figures.since + 10)
    # half a second in: (since + 121) - since can round to just under 121 s, which shows as 2 min 00 s
    late = figures.status(now=figures.since + 121.5)
    assert late.startswith(
        f"tests before: the regression baseline: the whole suite · running long (a test past {limit} fails alone) (2 min 01 s)"
    )
    figures(PhaseStarted(phase="agent", detail=""))  # not a test run: never running long
    assert "running long" not in figures.status(now=figures.since + 1000)
