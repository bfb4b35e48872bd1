"""The TUI's pure helpers: what streamed text is shown, control characters, completion order,
Markdown fences, the edit preview's fallbacks, command parsing, and the plan view's lines."""

from __future__ import annotations

from clover_agent.events import ToolCallFinished
from clover_agent.tui.export import _fence
from clover_agent.tui.keys import parse_command
from clover_agent.tui.text import printable, printable_event
from clover_agent.tui.widgets.agent_text import visible_prefix
from clover_agent.tui.widgets.path_menu import matching
from clover_agent.tui.widgets.plan_view import MAX_STEPS_SHOWN, plan_lines


def test_streamed_text_stops_at_a_tool_call_and_holds_back_a_partial_tag() -> None:
    assert visible_prefix("Fixing it.\n<tool_call>\n<function=x>") == "Fixing it.\n"
    assert visible_prefix("Fixing it. <tool_") == "Fixing it. "
    assert visible_prefix("a < b and <tool") == "a < b and "
    assert visible_prefix("a < b") == "a < b"  # a lone "<" followed by text is not a tag's start
    assert visible_prefix("ends with <") == "ends with "


def test_control_characters_become_visible() -> None:
    assert (
        printable("\x1b[2Jred\x07\x00 ok\n\ttab\x7f\x9b")
        == r"\x1b[2Jred\x07\x00 ok" + "\n\ttab" + r"\x7f\x9b"
    )
    assert printable("a\tb\nc", single_line=True) == r"a\tb\nc"
    assert printable("::add-mask::x") == "::add-mask::x"  # the screen is not a log
    event = ToolCallFinished(
        step=1,
        call_id="c",
        name="shell",
        output="\x1b[H",
        is_error=False,
        data={"report": {"outcomes": {"t\x1b": "passed"}}, "lines": ["\x1b"]},
    )
    shown = printable_event(event)
    assert shown.output == r"\x1b[H"
    assert shown.data == {"report": {"outcomes": {r"t\x1b": "passed"}}, "lines": [r"\x1b"]}
    assert event.output == "\x1b[H"  # the event itself (the trajectory's) is unchanged


def test_path_completion_puts_name_matches_first() -> None:
    files = ["docs/calc.md", "src/calculator.py", "tests/test_calculator.py", "README.md"]
    assert matching(files, "calc") == ["docs/calc.md", "src/calculator.py", "tests/test_calculator.py"]
    assert matching(files, "test_") == ["tests/test_calculator.py"]
    assert matching(files, "src/") == ["src/calculator.py"]
    assert len(matching([f"f{i}.py" for i in range(50)], "f")) == 6


def test_a_fence_is_longer_than_any_backtick_run_inside() -> None:
    assert _fence("plain") == "```\nplain\n```"
    assert _fence("a ```` b", "json").startswith("`````json\n")


def test_commands_are_slash_words() -> None:
    assert parse_command("/undo 2") == ("undo", "2")
    assert parse_command("  /TESTS tests/x.py ") == ("tests", "tests/x.py")
    assert parse_command("fix /workspace/a.py") is None
    assert parse_command("//not a command") is None


async def test_the_edit_preview_in_a_real_sandbox(tmp_path) -> None:
    from clover_agent.sandboxes.factory import create_sandbox
    from clover_agent.tui.preview import edit_preview
    from tests.sandbox_specs import sandbox_spec
    from tests.tui.helpers import calculator_repo

    repo = calculator_repo(tmp_path)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        create = await edit_preview(
            sandbox, "editor", {"command": "create", "path": "/workspace/new.py", "file_text": "X = 1\n"}
        )
        assert "+++ b/new.py" in create and "+X = 1" in create
        exact = await edit_preview(
            sandbox,
            "editor",
            {
                "command": "str_replace",
                "path": "calculator.py",
                "old_str": "return a * b",
                "new_str": "return b * a",
            },
        )
        assert (
            "-    return a * b" in exact and "+    return b * a" in exact and "def multiply" in exact
        )  # in context
        loose = await edit_preview(
            sandbox,
            "editor",
            {
                "command": "str_replace",
                "path": "/workspace/calculator.py",
                "old_str": "return a  *  b",
                "new_str": "x",
            },
        )
        assert loose.splitlines()[-2:] == ["-return a  *  b", "+x"]  # no exact match: the call's own texts
        insert = await edit_preview(
            sandbox,
            "editor",
            {"command": "insert", "path": "/workspace/calculator.py", "insert_line": 1, "new_str": "# hi"},
        )
        assert "+# hi" in insert
        assert await edit_preview(sandbox, "shell", {"command": "ls"}) == ""
        assert (repo / "calculator.py").read_text().count("return a * b") == 1  # nothing was written
        assert not (await sandbox.diff())


def test_the_plan_view_keeps_the_step_in_progress_in_sight() -> None:
    steps = [{"step": f"step {n} [b]x[/b]", "status": "completed"} for n in range(1, 11)]
    steps += [{"step": "step 11", "status": "in_progress"}, {"step": "step 12", "status": "pending"}]
    lines = plan_lines({"summary": "Twelve\nsteps", "steps": steps}).plain.splitlines()
    assert lines[0] == "Plan 10/12  Twelve steps"
    assert lines[1 : MAX_STEPS_SHOWN + 1][-3:] == ["✓ step 10 [b]x[/b]", "▸ step 11", "· step 12"]
    assert lines[-1] == "  (4 more steps: /plan show lists them all)"
    few = plan_lines({"summary": "s", "steps": steps[:2]}).plain.splitlines()
    assert few == ["Plan 2/2  s", "✓ step 1 [b]x[/b]", "✓ step 2 [b]x[/b]"]
