"""The tools facing a hostile workspace and hostile arguments, in every sandbox kind: special files,
bad strings, huge files and folders, odd names, identical edits. Each call ends in a result the
model can act on, never a hang or "the sandbox stopped working"."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
import pytest_asyncio

from clover_agent.sandboxes.base import Sandbox, SandboxLimits
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.base import ToolContext, ToolResult
from clover_agent.tools.editor_view import MAX_DIR_ENTRIES, MAX_VIEW_CHARS
from clover_agent.tools.registry import SANDBOX_LOST, execute
from clover_agent.tools.search import SearchTool
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE_S = 120  # generous: only a hang (the bug) takes longer


async def call(ctx: ToolContext, tool: str, **args: object) -> ToolResult:
    result = await asyncio.wait_for(execute(tool, args, ctx), DEADLINE_S)
    assert SANDBOX_LOST not in result.data, result.output
    result.output.encode("utf-8")  # always writable to a terminal or a trajectory
    return result


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile(sandbox: Sandbox) -> Sandbox:
    made = await sandbox.exec(
        "mkdir -p hostile && cd hostile && mkfifo pipe && ln -s pipe to_pipe && "
        "mkdir fifo_dir && mkfifo fifo_dir/inner && echo needle > fifo_dir/plain.txt && "
        "printf 'x\\n' > $'new\\nline.txt' && printf 'y\\n' > $'caf\\xe9.txt' && "
        "mkdir crowd && (cd crowd && touch $(seq -f 'file_%05g.txt' 1 5000))",
        timeout=120,
    )
    assert made.exit_code == 0, made.output
    return sandbox


async def test_special_files_are_a_clear_tool_error(hostile: Sandbox) -> None:
    sandbox = hostile
    ctx = ToolContext(sandbox)
    for path in ("/workspace/hostile/pipe", "/workspace/hostile/to_pipe"):
        for args in ({"command": "view"}, {"command": "str_replace", "old_str": "a", "new_str": "b"}):
            result = await call(ctx, "editor", path=path, **args)
            assert not result.ok
            assert result.output.startswith(f"The path {path} is a FIFO (named pipe), not a regular file")
        searched = await call(ctx, "search", pattern="x", path=path)
        assert not searched.ok and "FIFO (named pipe)" in searched.output
    assert ctx.edit_history == {}
    # A FIFO inside a searched folder is skipped, by ripgrep and by the fallback alike.
    for engine in (True, False):
        result = await asyncio.wait_for(
            SearchTool(use_ripgrep=engine).run(
                {"pattern": "needle", "path": "/workspace/hostile/fifo_dir"}, ctx
            ),
            DEADLINE_S,
        )
        assert result.data["matches"] == ["/workspace/hostile/fifo_dir/plain.txt:1:needle"]


@pytest.mark.parametrize(
    "tool,args,named",
    [
        ("shell", {"command": "echo a\0b"}, "`command` contains a NUL byte (character 7)"),
        ("shell", {"command": "echo \ud800"}, "`command` contains a lone surrogate (\\ud800, character 6)"),
        ("editor", {"command": "view", "path": "/workspace/\0"}, "`path` contains a NUL byte"),
        ("editor", {"command": "create", "path": "/workspace/n.txt", "file_text": "a\0b"}, "`file_text`"),
        ("editor", {"command": "create", "path": "/workspace/s.txt", "file_text": "\udc80"}, "`file_text`"),
        ("search", {"pattern": "a\0"}, "`pattern` contains a NUL byte"),
        ("run_tests", {"target": "tests/\ud83d"}, "`target` contains a lone surrogate"),
    ],
)
async def test_bad_strings_are_refused_with_the_argument_named(
    sandbox: Sandbox, tool: str, args: dict, named: str
) -> None:
    result = await call(ToolContext(sandbox), tool, **args)
    assert not result.ok and named in result.output
    assert (await sandbox.exec("echo alive")).output == "alive\n"
    assert await sandbox.stat("/workspace/n.txt") is None and await sandbox.stat("/workspace/s.txt") is None


async def test_a_300_mb_file_is_never_shipped_whole(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    made = await sandbox.exec("seq 1 40000000 > /workspace/huge.log", timeout=300)  # ~379 MB
    assert made.exit_code == 0, made.output
    tracemalloc.start()
    try:
        whole = await call(ctx, "editor", command="view", path="/workspace/huge.log")
        part = await call(
            ctx, "editor", command="view", path="/workspace/huge.log", view_range=[20_000_000, 20_000_002]
        )
        tail = await call(
            ctx, "editor", command="view", path="/workspace/huge.log", view_range=[39_999_999, -1]
        )
        too_far = await call(
            ctx, "editor", command="view", path="/workspace/huge.log", view_range=[40_000_001, -1]
        )
        edit = await call(
            ctx, "editor", command="str_replace", path="/workspace/huge.log", old_str="7", new_str="8"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await sandbox.exec("rm -f /workspace/huge.log")
    assert peak < 30 * 1024 * 1024  # the file is ~380 MB: none of it came over whole
    assert not whole.ok and "over the 10,000,000-byte limit for the editor" in whole.output
    assert "give `view_range`, e.g. [1, 200]" in whole.output
    assert part.ok and part.output.splitlines()[1:] == [
        "20000000\t20000000",
        "20000001\t20000001",
        "20000002\t20000002",
    ]
    assert part.data["lines"] == 40_000_000
    assert tail.ok and tail.output.splitlines()[-1] == "40000000\t40000000"
    assert not too_far.ok and "Its first element `40000001` should be within the range" in too_far.output
    assert not edit.ok and "over the 10,000,000-byte limit" in edit.output


async def test_a_range_view_of_a_huge_file_is_cut_and_says_so(sandbox: Sandbox) -> None:
    await sandbox.exec(
        "yes 'a fairly long line of text for the view' | head -c 12000000 > /workspace/wide.txt"
    )
    try:
        result = await call(
            ToolContext(sandbox), "editor", command="view", path="/workspace/wide.txt", view_range=[1, -1]
        )
    finally:
        await sandbox.exec("rm -f /workspace/wide.txt")
    assert result.ok and len(result.output) < MAX_VIEW_CHARS + 500
    assert (
        "[... output cut: showing lines 1-" in result.output
        and "Use `view_range` to see the rest" in result.output
    )


async def test_a_folder_of_5000_files_is_capped_with_a_notice(hostile: Sandbox) -> None:
    sandbox = hostile
    result = await call(ToolContext(sandbox), "editor", command="view", path="/workspace/hostile")
    assert result.ok and len(result.output) < MAX_VIEW_CHARS + 1000
    assert result.output.startswith(
        "Here's the files and directories 1 level deep in /workspace/hostile, excluding hidden items:\n"
        "/workspace/hostile\n"
    )
    assert "/workspace/hostile/crowd/" in result.output
    assert "/workspace/hostile/crowd/file_00001.txt" not in result.output
    assert f"entries up to 2 levels deep, over the {MAX_DIR_ENTRIES:,} a view lists" in result.output
    assert result.data["depth"] == 1
    crowd = await call(ToolContext(sandbox), "editor", command="view", path="/workspace/hostile/crowd")
    shown = [line for line in crowd.output.splitlines() if line.startswith("/workspace/hostile/crowd/")]
    assert len(shown) == MAX_DIR_ENTRIES and shown[0].endswith("file_00001.txt")
    assert "showing 1,000 of its 5,000 first-level entries" in crowd.output


async def test_odd_file_names_are_shown_escaped(hostile: Sandbox) -> None:
    sandbox = hostile
    result = await call(ToolContext(sandbox), "editor", command="view", path="/workspace/hostile")
    lines = result.output.splitlines()
    assert "/workspace/hostile/new\\nline.txt" in lines  # one entry, not two lines
    assert "/workspace/hostile/caf\\xe9.txt" in lines  # a byte that is not UTF-8
    found = await call(ToolContext(sandbox), "search", pattern="^y$", path="/workspace/hostile", glob="caf*")
    assert found.ok and found.data["total"] == 1


async def test_identical_replacement_is_refused_without_an_undo_step(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/same.py", b"x = 1  \ny = 2\n")
    before = (await sandbox.exec("stat -c %Y.%s same.py")).output
    same = await call(
        ctx, "editor", command="str_replace", path="/workspace/same.py", old_str="x = 1", new_str="x = 1"
    )
    assert not same.ok
    assert same.output == "No replacement was performed. `new_str` and `old_str` must be different."
    # Different strings that leave the file as it is (matched ignoring trailing spaces) are no edit either.
    no_change = await call(
        ctx,
        "editor",
        command="str_replace",
        path="/workspace/same.py",
        old_str="x = 1\ny = 2",
        new_str="x = 1  \ny = 2",
    )
    assert not no_change.ok and "leaves the file as it is" in no_change.output
    assert ctx.edit_history == {}
    assert (await sandbox.exec("stat -c %Y.%s same.py")).output == before
    undo = await call(ctx, "editor", command="undo_edit", path="/workspace/same.py")
    assert not undo.ok and undo.output == "No edit history found for /workspace/same.py."


async def test_line_numbers_agree_with_grep_when_lines_hold_form_feeds(sandbox: Sandbox) -> None:
    await sandbox.write_file("/workspace/ff.py", b"a = 1\n\x0c\nb = 2\x0bc\nd = 3\n")
    view = await call(ToolContext(sandbox), "editor", command="view", path="/workspace/ff.py")
    grep = await sandbox.exec("grep -n 'd = 3' ff.py")
    assert grep.output.startswith("4:")
    assert view.output.splitlines()[-1] == "     4\td = 3"
    inserted = await call(
        ToolContext(sandbox),
        "editor",
        command="insert",
        path="/workspace/ff.py",
        insert_line=3,
        new_str="e = 4",
    )
    assert inserted.ok
    assert await sandbox.read_file("/workspace/ff.py") == b"a = 1\n\x0c\nb = 2\x0bc\ne = 4\nd = 3\n"


@pytest.mark.docker
async def test_editor_on_a_full_workspace_says_so(tmp_path) -> None:
    repo = make_repo(tmp_path / "full", {"a.txt": "a\n"})
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=32 * 1024 * 1024))
    async with create_sandbox("docker", spec) as sandbox:
        ctx = ToolContext(sandbox)
        filled = await call(ctx, "shell", command="head -c 100M /dev/zero > fill.bin")
        assert "[Out of space: /workspace is full: " in filled.output
        created = await call(
            ctx, "editor", command="create", path="/workspace/b.txt", file_text="b" * 100_000
        )
        assert not created.ok and created.output.startswith(
            "Could not write /workspace/b.txt: No space left on device."
        )
        assert "The workspace is out of space: delete files you do not need" in created.output
        edited = await call(
            ctx, "editor", command="str_replace", path="/workspace/a.txt", old_str="a", new_str="b" * 100_000
        )
        assert not edited.ok and "Nothing was changed." in edited.output
        assert await sandbox.read_file("/workspace/a.txt") == b"a\n" and ctx.edit_history == {}
