"""Path escapes: every attempt to reach outside /workspace is refused, and nothing outside is read or
written (checked on the sandbox's own /etc and on a folder next to the workspace)."""

from __future__ import annotations

import uuid

import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import ToolContext
from clover_agent.tools.registry import execute

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: The folder next to the workspace; this process's own (the local sandbox's /tmp is the host's,
#: where tests running beside this one rewrite theirs).
OUTSIDE = f"/tmp/clover-outside-{uuid.uuid4().hex[:12]}"

ESCAPES = [
    ("editor", {"command": "view", "path": "/workspace/../etc/passwd"}),
    ("editor", {"command": "view", "path": "/etc/passwd"}),
    ("editor", {"command": "view", "path": "/workspace/etclink/passwd"}),
    ("editor", {"command": "view", "path": "/workspace/etclink"}),
    ("editor", {"command": "view", "path": "/workspace/pwlink"}),
    ("editor", {"command": "view", "path": "etc/passwd"}),
    ("editor", {"command": "view", "path": "/workspace/outlink/data.txt"}),
    ("editor", {"command": "create", "path": "/etc/clover-escape", "file_text": "x"}),
    ("editor", {"command": "create", "path": "/workspace/../etc/clover-escape", "file_text": "x"}),
    ("editor", {"command": "create", "path": "/workspace/etclink/clover-escape", "file_text": "x"}),
    ("editor", {"command": "create", "path": "/workspace/outlink/new.txt", "file_text": "x"}),
    (
        "editor",
        {"command": "str_replace", "path": "/workspace/etclink/passwd", "old_str": "root", "new_str": "r"},
    ),
    ("editor", {"command": "str_replace", "path": "/workspace/pwlink", "old_str": "root", "new_str": "r"}),
    (
        "editor",
        {
            "command": "str_replace",
            "path": "/workspace/outlink/data.txt",
            "old_str": "outside",
            "new_str": "x",
        },
    ),
    ("editor", {"command": "insert", "path": "/workspace/etclink/passwd", "insert_line": 0, "new_str": "x"}),
    (
        "editor",
        {"command": "insert", "path": "/workspace/outlink/data.txt", "insert_line": 0, "new_str": "x"},
    ),
    ("editor", {"command": "undo_edit", "path": "/etc/passwd"}),
    ("search", {"pattern": "root", "path": "/etc"}),
    ("search", {"pattern": "root", "path": "/workspace/.."}),
    ("search", {"pattern": "root", "path": "/workspace/etclink"}),
    ("search", {"pattern": "outside", "path": "/workspace/outlink"}),
    ("search", {"pattern": "root", "path": "etc"}),
    ("run_tests", {"target": "/etc"}),
    ("run_tests", {"target": "../etc/passwd"}),
]


async def snapshot(sandbox: Sandbox) -> str:
    """Contents and mtimes of what an escape would touch, as the sandbox sees them."""
    result = await sandbox.exec(
        'stat -c \'%n %s %Y\' /etc/passwd "$OUT"/data.txt; sha256sum /etc/passwd "$OUT"/data.txt; '
        'ls -a /etc | grep -c clover-escape; ls -a "$OUT"',
        cwd="/workspace",
        env={"OUT": OUTSIDE},
    )
    return result.output


@pytest.mark.parametrize(
    "name,args", ESCAPES, ids=[f"{n}-{a.get('command', '')}-{i}" for i, (n, a) in enumerate(ESCAPES)]
)
async def test_escape_refused_and_nothing_outside_touched(
    sandbox: Sandbox, name: str, args: dict[str, object]
) -> None:
    await sandbox.exec(
        f"mkdir -p {OUTSIDE} && printf 'outside\\n' > {OUTSIDE}/data.txt "
        f"&& touch -d '2020-01-01' {OUTSIDE}/data.txt; "
        f"ln -sfn /etc etclink; ln -sfn /etc/passwd pwlink; ln -sfn {OUTSIDE} outlink",
        cwd="/workspace",
    )
    before = await snapshot(sandbox)
    result = await execute(name, args, ToolContext(sandbox))
    assert not result.ok, result.output
    assert "root:" not in result.output and "outside\n" not in result.output
    path = str(args.get("path", args.get("target", "")))
    if not path.startswith("/"):
        assert "Use an absolute path: maybe you meant /workspace/" in result.output or name == "run_tests"
    elif name != "run_tests" and args.get("command") != "undo_edit":
        assert "workspace" in result.output and ("outside" in result.output or "escapes" in result.output)
    assert await snapshot(sandbox) == before


async def test_messages_say_why(sandbox: Sandbox) -> None:
    ctx = ToolContext(sandbox)
    await sandbox.exec("ln -sfn /etc etclink", cwd="/workspace")
    dots = await execute("editor", {"command": "view", "path": "/workspace/../etc/passwd"}, ctx)
    assert (
        dots.output
        == "The path /workspace/../etc/passwd escapes the workspace through `..`; only /workspace can be used."
    )
    absolute = await execute("editor", {"command": "view", "path": "/etc/passwd"}, ctx)
    assert (
        absolute.output
        == "The path /etc/passwd is outside the workspace; only paths inside /workspace can be used."
    )
    link = await execute("editor", {"command": "view", "path": "/workspace/etclink/passwd"}, ctx)
    assert link.output == (
        "The path /workspace/etclink/passwd resolves to /etc/passwd through a symbolic link, which is outside "
        "the workspace; only /workspace can be used."
    )
    relative = await execute("editor", {"command": "view", "path": "src/calc.py"}, ctx)
    assert relative.output == (
        "The path src/calc.py is not an absolute path, it should start with `/`. "
        "Use an absolute path: maybe you meant /workspace/src/calc.py?"
    )
    climbing = await execute("editor", {"command": "view", "path": "../etc/passwd"}, ctx)
    assert climbing.output == (
        "The path ../etc/passwd is not an absolute path, it should start with `/`. "
        "Use an absolute path: it must be inside /workspace."
    )
    # Inside stays fine: `..` that does not leave, and a symlink to a workspace file.
    await sandbox.exec("ln -sfn src/calc.py calclink", cwd="/workspace")
    inside = await execute("editor", {"command": "view", "path": "/workspace/src/../src/calc.py"}, ctx)
    assert inside.ok
    via_link = await execute("editor", {"command": "view", "path": "/workspace/calclink"}, ctx)
    assert via_link.ok and "def add" in via_link.output
