"""The editor's commands and messages, in every sandbox kind."""

from __future__ import annotations

import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import ToolContext
from clover_agent.tools.editor_view import MAX_VIEW_CHARS
from clover_agent.tools.registry import execute
from clover_agent.tools.textfile import MAX_TEXT_BYTES

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def edit(ctx: ToolContext, **args: object):
    return await execute("editor", args, ctx)


async def test_view_file_is_cat_n(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    result = await edit(ctx, command="view", path="/workspace/src/calc.py")
    assert result.ok
    assert result.output == (
        "Here's the result of running `cat -n` on /workspace/src/calc.py:\n"
        "     1\tdef add(a, b):\n"
        "     2\t    return a - b\n"
    )


async def test_view_range_and_its_errors(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/ten.txt", "".join(f"line {i}\n" for i in range(1, 11)).encode())
    middle = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[3, 4])
    assert middle.output.splitlines()[1:] == ["     3\tline 3", "     4\tline 4"]
    to_end = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[9, -1])
    assert to_end.output.splitlines()[1:] == ["     9\tline 9", "    10\tline 10"]
    bad_start = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[0, 2])
    assert not bad_start.ok
    assert bad_start.output == (
        "Invalid `view_range`: [0, 2]. Its first element `0` should be within the range of lines of the file: [1, 10]"
    )
    bad_end = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[2, 11])
    assert (
        "Its second element `11` should be smaller than the number of lines in the file: `10`"
        in bad_end.output
    )
    backwards = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[5, 4])
    assert "Its second element `4` should be larger or equal than its first `5`" in backwards.output
    wrong_len = await edit(ctx, command="view", path="/workspace/ten.txt", view_range=[5])
    assert wrong_len.output == "Invalid `view_range`. It should be a list of two integers."


async def test_view_directory_two_levels_without_hidden(sandbox: Sandbox) -> None:
    result = await edit(ToolContext(sandbox), command="view", path="/workspace/src")
    assert result.ok
    lines = result.output.splitlines()
    assert (
        lines[0]
        == "Here's the files and directories up to 2 levels deep in /workspace/src, excluding hidden items:"
    )
    assert lines[1] == "/workspace/src"
    assert "/workspace/src/calc.py" in lines and "/workspace/src/pkg/" in lines
    assert "/workspace/src/pkg/deep/" in lines
    assert "/workspace/src/pkg/deep/inner.py" not in lines  # three levels down
    top = await edit(ToolContext(sandbox), command="view", path="/workspace")
    assert not any(".hidden" in line or ".git" in line for line in top.output.splitlines())
    ranged = await edit(ToolContext(sandbox), command="view", path="/workspace/src", view_range=[1, 2])
    assert ranged.output == "The `view_range` parameter is not allowed when `path` points to a directory."


async def test_create_refuses_to_overwrite(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    created = await edit(ctx, command="create", path="/workspace/new/dir/hello.py", file_text="print('hi')\n")
    assert created.ok and created.output == "File created successfully at: /workspace/new/dir/hello.py"
    assert await sandbox.read_file("/workspace/new/dir/hello.py") == b"print('hi')\n"
    assert created.data["new_content"] == "print('hi')\n" and "+print('hi')" in created.data["diff"]
    again = await edit(ctx, command="create", path="/workspace/new/dir/hello.py", file_text="x = 1\n")
    assert not again.ok
    assert again.output == (
        "File already exists at: /workspace/new/dir/hello.py. Cannot overwrite files using command `create`."
    )
    assert await sandbox.read_file("/workspace/new/dir/hello.py") == b"print('hi')\n"
    missing_text = await edit(ctx, command="create", path="/workspace/other.py")
    assert missing_text.output == "Parameter `file_text` is required for command: create"


async def test_str_replace_exactly_once_with_snippet_and_diff(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/sr.py", b"def add(a, b):\n    return a - b\n")
    result = await edit(ctx, command="str_replace", path="/workspace/sr.py", old_str="a - b", new_str="a + b")
    assert result.ok
    assert result.output == (
        "The file /workspace/sr.py has been edited. Here's the result of running `cat -n` on a snippet of "
        "/workspace/sr.py:\n     1\tdef add(a, b):\n     2\t    return a + b\n"
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )
    assert await sandbox.read_file("/workspace/sr.py") == b"def add(a, b):\n    return a + b\n"
    assert result.data["rung"] == "exact"
    assert result.data["old_content"] == "def add(a, b):\n    return a - b\n"
    assert result.data["new_content"] == "def add(a, b):\n    return a + b\n"
    assert "-    return a - b\n+    return a + b\n" in result.data["diff"]


async def test_str_replace_not_found_and_ambiguous_messages(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/dup.py", b"x = 1\ny = 2\nx = 1\n")
    missing = await edit(ctx, command="str_replace", path="/workspace/dup.py", old_str="z = 3", new_str="")
    assert not missing.ok
    assert (
        missing.output
        == "No replacement was performed, old_str `z = 3` did not appear verbatim in /workspace/dup.py."
    )
    ambiguous = await edit(
        ctx, command="str_replace", path="/workspace/dup.py", old_str="x = 1", new_str="x = 9"
    )
    assert not ambiguous.ok
    assert ambiguous.output == (
        "No replacement was performed. Multiple occurrences of old_str `x = 1` in lines [1, 3]. "
        "Please ensure it is unique."
    )
    assert await sandbox.read_file("/workspace/dup.py") == b"x = 1\ny = 2\nx = 1\n"
    everywhere = await edit(
        ctx,
        command="str_replace",
        path="/workspace/dup.py",
        old_str="x = 1",
        new_str="x = 9",
        replace_all=True,
    )
    assert everywhere.ok and "Replaced 2 occurrences" in everywhere.output
    assert await sandbox.read_file("/workspace/dup.py") == b"x = 9\ny = 2\nx = 9\n"
    empty = await edit(ctx, command="str_replace", path="/workspace/dup.py", old_str="", new_str="a")
    assert not empty.ok and "`old_str` is empty" in empty.output
    no_old = await edit(ctx, command="str_replace", path="/workspace/dup.py", new_str="a")
    assert no_old.output == "Parameter `old_str` is required for command: str_replace"


async def test_matching_ladder_reports_its_rung(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/crlf.txt", b"alpha\r\nbeta\r\ngamma\r\n")
    crlf = await edit(
        ctx, command="str_replace", path="/workspace/crlf.txt", old_str="alpha\nbeta", new_str="A\nB"
    )
    assert crlf.ok and crlf.data["rung"] == "line_endings"
    assert "treating LF and CRLF line breaks alike" in crlf.output
    # CRLF kept, including in the new text.
    assert await sandbox.read_file("/workspace/crlf.txt") == b"A\r\nB\r\ngamma\r\n"

    await sandbox.write_file("/workspace/ws.py", b"if x:   \n    go()\t\nend\n")
    ws = await edit(
        ctx, command="str_replace", path="/workspace/ws.py", old_str="if x:\n    go()\n", new_str="if y:\n"
    )
    assert ws.ok and ws.data["rung"] == "trailing_whitespace"
    assert "ignoring whitespace at the ends of lines" in ws.output
    assert await sandbox.read_file("/workspace/ws.py") == b"if y:\nend\n"

    # Ambiguity is judged at the deciding rung: two whitespace-insensitive matches fail.
    await sandbox.write_file("/workspace/ws2.py", b"a = 1  \nb\na = 1\t\nb\n")
    amb = await edit(ctx, command="str_replace", path="/workspace/ws2.py", old_str="a = 1\nb", new_str="c")
    assert not amb.ok and "Multiple occurrences of old_str `a = 1\nb` in lines [1, 3]" in amb.output


async def test_insert_after_line_and_at_top(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/ins.py", b"one\ntwo\n")
    top = await edit(ctx, command="insert", path="/workspace/ins.py", insert_line=0, new_str="zero")
    assert top.ok
    assert top.output == (
        "The file /workspace/ins.py has been edited. Here's the result of running `cat -n` on a snippet of the "
        "edited file:\n     1\tzero\n     2\tone\n     3\ttwo\nReview the changes and make sure they are as "
        "expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary."
    )
    end = await edit(ctx, command="insert", path="/workspace/ins.py", insert_line=3, new_str="three\nfour\n")
    assert end.ok
    assert await sandbox.read_file("/workspace/ins.py") == b"zero\none\ntwo\nthree\nfour\n"
    bad = await edit(ctx, command="insert", path="/workspace/ins.py", insert_line=9, new_str="x")
    assert bad.output == (
        "Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 5]"
    )
    await sandbox.write_file("/workspace/nonl.txt", b"last")  # no final line break
    await edit(ctx, command="insert", path="/workspace/nonl.txt", insert_line=1, new_str="after")
    assert await sandbox.read_file("/workspace/nonl.txt") == b"last\nafter"


async def test_undo_edit_per_file_history(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/u1.txt", b"a\n")
    await sandbox.write_file("/workspace/u2.txt", b"b\n")
    await edit(ctx, command="str_replace", path="/workspace/u1.txt", old_str="a", new_str="a1")
    await edit(ctx, command="str_replace", path="/workspace/u2.txt", old_str="b", new_str="b1")
    await edit(ctx, command="str_replace", path="/workspace/u1.txt", old_str="a1", new_str="a2")
    first = await edit(ctx, command="undo_edit", path="/workspace/u1.txt")
    assert first.ok and first.output.startswith("Last edit to /workspace/u1.txt undone successfully.")
    assert await sandbox.read_file("/workspace/u1.txt") == b"a1\n"
    await edit(ctx, command="undo_edit", path="/workspace/u1.txt")
    assert await sandbox.read_file("/workspace/u1.txt") == b"a\n"
    assert await sandbox.read_file("/workspace/u2.txt") == b"b1\n"  # the other file keeps its edit
    none_left = await edit(ctx, command="undo_edit", path="/workspace/u1.txt")
    assert not none_left.ok and none_left.output == "No edit history found for /workspace/u1.txt."
    await edit(ctx, command="create", path="/workspace/made.txt", file_text="new\n")
    undo_create = await edit(ctx, command="undo_edit", path="/workspace/made.txt")
    assert undo_create.ok and "has been removed" in undo_create.output
    assert await sandbox.stat("/workspace/made.txt") is None


async def test_encodings_and_line_endings_preserved(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    latin = "café = 'crème'\nother = 1\n".encode("latin-1")
    await sandbox.write_file("/workspace/latin.py", latin)
    result = await edit(
        ctx, command="str_replace", path="/workspace/latin.py", old_str="other = 1", new_str="other = 2"
    )
    assert result.ok
    assert await sandbox.read_file("/workspace/latin.py") == "café = 'crème'\nother = 2\n".encode("latin-1")
    utf8 = "naïve = '✓'\r\nkeep = 1\r\n".encode()
    await sandbox.write_file("/workspace/utf8.py", utf8)
    await edit(ctx, command="insert", path="/workspace/utf8.py", insert_line=1, new_str="added = 'ü'")
    assert (
        await sandbox.read_file("/workspace/utf8.py") == "naïve = '✓'\r\nadded = 'ü'\r\nkeep = 1\r\n".encode()
    )
    unencodable = await edit(
        ctx, command="str_replace", path="/workspace/latin.py", old_str="other", new_str="✓"
    )
    assert not unencodable.ok and "latin-1-encoded" in unencodable.output
    assert await sandbox.read_file("/workspace/latin.py") == "café = 'crème'\nother = 2\n".encode("latin-1")


async def test_binary_and_huge_files_refused(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/blob.bin", b"\x00\x01\x02abc")
    binary = await edit(ctx, command="view", path="/workspace/blob.bin")
    assert (
        not binary.ok
        and binary.output
        == "The file /workspace/blob.bin appears to be binary; the editor only works on text files."
    )
    await sandbox.write_file("/workspace/huge.txt", b"a" * (MAX_TEXT_BYTES + 1))
    huge = await edit(ctx, command="str_replace", path="/workspace/huge.txt", old_str="a", new_str="b")
    assert not huge.ok and "over the 10,000,000-byte limit" in huge.output
    await sandbox.exec("rm -f huge.txt", cwd="/workspace")


async def test_missing_paths_and_directories(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    missing = await edit(ctx, command="view", path="/workspace/nope.py")
    assert missing.output == "The path /workspace/nope.py does not exist. Please provide a valid path."
    on_dir = await edit(ctx, command="str_replace", path="/workspace/src", old_str="a", new_str="b")
    assert on_dir.output == (
        "The path /workspace/src is a directory and only the `view` command can be used on directories."
    )


async def test_long_view_is_cut_with_a_note(sandbox: Sandbox) -> None:
    text = "".join(f"row {i:05d} {'x' * 30}\n" for i in range(1, 5001))
    await sandbox.write_file("/workspace/long.txt", text.encode())
    result = await edit(ToolContext(sandbox), command="view", path="/workspace/long.txt")
    assert result.ok and len(result.output) < MAX_VIEW_CHARS + 500
    body = result.output.splitlines()
    last_shown = int(body[-2].split("\t")[0])
    assert body[-2] == f"{last_shown:6}\trow {last_shown:05d} {'x' * 30}"
    assert body[-1] == (
        f"[... output cut: showing lines 1-{last_shown} of 5000. Use `view_range` to see the rest, "
        "or the search tool to find the line numbers you need.]"
    )
    tail = await edit(ToolContext(sandbox), command="view", path="/workspace/long.txt", view_range=[4999, -1])
    assert tail.output.splitlines()[1:] == [f"  4999\trow 04999 {'x' * 30}", f"  5000\trow 05000 {'x' * 30}"]


async def test_undo_restores_a_deleted_file_and_write_errors_are_clear(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.write_file("/workspace/gone.txt", b"v1\n")
    await edit(ctx, command="str_replace", path="/workspace/gone.txt", old_str="v1", new_str="v2")
    await sandbox.exec("rm gone.txt", cwd="/workspace")
    undone = await edit(ctx, command="undo_edit", path="/workspace/gone.txt")
    assert undone.ok and await sandbox.read_file("/workspace/gone.txt") == b"v1\n"
    blocked = await edit(ctx, command="create", path="/workspace/gone.txt/child.txt", file_text="x")
    assert not blocked.ok and blocked.output.startswith("Could not write /workspace/gone.txt/child.txt: ")
    assert blocked.output.endswith("Nothing was changed.")
    # A failed undo says why, changes nothing and keeps the edit undoable.
    await sandbox.write_file("/workspace/nest/f.txt", b"v1\n")
    await edit(ctx, command="str_replace", path="/workspace/nest/f.txt", old_str="v1", new_str="v2")
    await sandbox.exec("rm -rf nest && echo file > nest", cwd="/workspace")
    failed = await edit(ctx, command="undo_edit", path="/workspace/nest/f.txt")
    assert not failed.ok and failed.output.startswith(
        "Could not undo the last edit to /workspace/nest/f.txt: "
    )
    assert failed.output.endswith("Nothing was changed.")
    assert await sandbox.read_file("/workspace/nest") == b"file\n"
    await sandbox.exec("rm nest", cwd="/workspace")
    retried = await edit(ctx, command="undo_edit", path="/workspace/nest/f.txt")
    assert retried.ok and await sandbox.read_file("/workspace/nest/f.txt") == b"v1\n"
