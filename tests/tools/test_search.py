"""The search tool, with ripgrep and with the Python fallback; both must give the same answers."""

from __future__ import annotations

import pytest
import pytest_asyncio

from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import ToolContext, ToolError, ToolResult
from clover_agent.tools.registry import execute
from clover_agent.tools.search import MAX_MATCHES, SearchTool

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENGINES = ["ripgrep", "python"]


async def search(sandbox: Sandbox, engine: str, **args: object) -> ToolResult:
    tool = SearchTool(use_ripgrep=engine == "ripgrep")
    tool.validate(args)
    return await tool.run(args, ToolContext(sandbox))


@pytest_asyncio.fixture(scope="module", loop_scope="module", autouse=True)
async def search_files(sandbox: Sandbox) -> None:
    files = {
        "/workspace/sd/a.py": "import os\ndef needle_one():\n    return 1\n",
        "/workspace/sd/b.txt": "a needle in text\nnothing\n",
        "/workspace/sd/sub/c.py": "x = 'needle'\n",
        "/workspace/sd/.hid/d.py": "needle hidden\n",
        "/workspace/sd/bin.dat": "needle\0binary",
        "/workspace/many/lots.txt": "".join(f"hit {i}\n" for i in range(150)),
    }
    for path, text in files.items():
        await sandbox.write_file(path, text.encode())


@pytest.mark.parametrize("engine", ENGINES)
async def test_matches_with_line_numbers(sandbox: Sandbox, engine: str) -> None:
    result = await search(sandbox, engine, pattern=r"needle", path="/workspace/sd")
    assert result.ok and result.data["engine"] == engine
    assert result.data["matches"] == [
        "/workspace/sd/a.py:2:def needle_one():",
        "/workspace/sd/b.txt:1:a needle in text",
        "/workspace/sd/sub/c.py:1:x = 'needle'",
    ]
    assert result.output.startswith("Found 3 matching lines for pattern 'needle' in /workspace/sd:\n")


@pytest.mark.parametrize("engine", ENGINES)
async def test_glob_single_file_and_no_match(sandbox: Sandbox, engine: str) -> None:
    py = await search(sandbox, engine, pattern=r"needle", path="/workspace/sd", glob="*.py")
    assert py.data["matches"] == [
        "/workspace/sd/a.py:2:def needle_one():",
        "/workspace/sd/sub/c.py:1:x = 'needle'",
    ]
    nested = await search(sandbox, engine, pattern=r"needle", path="/workspace/sd", glob="sub/**/*.py")
    assert nested.data["matches"] == ["/workspace/sd/sub/c.py:1:x = 'needle'"]
    one = await search(sandbox, engine, pattern=r"ret\w+ 1", path="/workspace/sd/a.py")
    assert one.data["matches"] == ["/workspace/sd/a.py:3:    return 1"]
    none = await search(sandbox, engine, pattern=r"zzz_absent", path="/workspace/sd")
    assert none.ok and none.output == "No matches found for pattern 'zzz_absent' in /workspace/sd."


@pytest.mark.parametrize("engine", ENGINES)
async def test_results_are_capped(sandbox: Sandbox, engine: str) -> None:
    result = await search(sandbox, engine, pattern=r"^hit \d+$", path="/workspace/many")
    assert result.data["total"] == 150 and len(result.data["matches"]) == MAX_MATCHES
    assert result.data["matches"][0] == "/workspace/many/lots.txt:1:hit 0"
    assert result.output.endswith(
        "[... 50 more matching lines omitted; narrow the pattern, path or glob ...]"
    )


@pytest.mark.parametrize("engine", ENGINES)
async def test_bad_regex_and_missing_path(sandbox: Sandbox, engine: str) -> None:
    ctx = ToolContext(sandbox)
    tool = SearchTool(use_ripgrep=engine == "ripgrep")
    with pytest.raises(ToolError, match=r"(?i)regex|regular expression"):
        await tool.run({"pattern": "(unclosed", "path": "/workspace/sd"}, ctx)
    with pytest.raises(ToolError, match="does not exist"):
        await tool.run({"pattern": "x", "path": "/workspace/nowhere"}, ctx)


async def test_default_engine_and_registry_call(sandbox: Sandbox) -> None:
    rg_there = (await sandbox.exec("command -v rg")).exit_code == 0
    result = await execute("search", {"pattern": "def add", "glob": "*.py"}, ToolContext(sandbox))
    assert result.ok and result.data["engine"] == ("ripgrep" if rg_there else "python")
    assert result.data["matches"] == ["/workspace/src/calc.py:1:def add(a, b):"]
    bad = await execute("search", {"pattern": ""}, ToolContext(sandbox))
    assert not bad.ok and "`pattern`" in bad.output


@pytest.mark.parametrize("engine", ENGINES)
async def test_unreadable_files_are_reported_not_fatal(sandbox: Sandbox, engine: str) -> None:
    if (await sandbox.exec("id -u")).output.strip() == "0":
        pytest.skip("the sandbox user is root here: nothing is unreadable")
    await sandbox.write_file("/workspace/locked/open.txt", b"needle open\n")
    await sandbox.write_file("/workspace/locked/closed.txt", b"needle closed\n")
    await sandbox.exec("chmod 000 locked/closed.txt", cwd="/workspace")
    try:
        result = await search(sandbox, engine, pattern="needle", path="/workspace/locked")
    finally:
        await sandbox.exec("chmod 644 locked/closed.txt", cwd="/workspace")
    assert result.ok and result.data["matches"] == ["/workspace/locked/open.txt:1:needle open"]
    assert len(result.data["problems"]) == 1 and "closed.txt" in result.data["problems"][0]
    assert "[1 files could not be searched: " in result.output
