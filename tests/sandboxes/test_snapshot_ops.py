"""The operations the host takes its own stock of a workspace with: ``stop_processes`` (daemons
included), ``tree``, ``read_files``, ``put`` and ``copy_file``, on both sandbox kinds, against hostile layouts."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from clover_agent.sandboxes.base import Put, Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

#: Daemons appending to a file every 0.1 s: one in a session of its own, one double-forked into a
#: process group of its own (job control), so killing the command's process group misses both.
SETSID_DAEMON = "setsid bash -c 'while :; do echo s >> /workspace/setsid.log; sleep 0.1; done' >/dev/null 2>&1 < /dev/null &"
DOUBLE_FORK = "( set -m; ( while :; do echo d >> /workspace/fork.log; sleep 0.1; done ) >/dev/null 2>&1 < /dev/null & ) &"
#: Started with this, then the command waits a moment (so both have left its group when it ends).
DAEMONS = f"{SETSID_DAEMON} {DOUBLE_FORK} sleep 1; echo started"


async def size_of(sandbox: Sandbox, name: str) -> int:
    entry = await sandbox.stat(f"/workspace/{name}")
    return 0 if entry is None else entry.size


async def grows(sandbox: Sandbox, name: str, *, within: float = 30.0) -> bool:
    """Whether ``name`` keeps growing (a daemon still writes it)."""
    deadline = time.monotonic() + within
    first = await size_of(sandbox, name)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        if await size_of(sandbox, name) > first:
            return True
    return False


async def test_stop_processes_ends_setsid_and_double_forked_daemons(sandbox: Sandbox) -> None:
    result = await sandbox.exec(DAEMONS)
    assert result.exit_code == 0 and "started" in result.output
    # Both outlived their command (they left its process group).
    assert await grows(sandbox, "setsid.log") and await grows(sandbox, "fork.log")
    killed = await sandbox.stop_processes()
    assert killed >= 2
    sizes = (await size_of(sandbox, "setsid.log"), await size_of(sandbox, "fork.log"))
    await asyncio.sleep(1.0)
    assert (await size_of(sandbox, "setsid.log"), await size_of(sandbox, "fork.log")) == sizes
    assert not await grows(sandbox, "fork.log", within=1.0)
    # The sandbox still works, and with nothing running there is nothing to kill.
    assert (await sandbox.exec("echo alive")).output == "alive\n"
    assert await sandbox.stop_processes() == 0


async def test_tree_lists_kinds_hashes_and_never_follows_links(sandbox: Sandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    setup = (
        f"ln -s {outside} out && ln -s src/calc.py calc-link && mkfifo pipe && mkdir -p nested/.git "
        "&& echo x > nested/inner.py && mkdir -p build/deep && echo b > build/deep/x.o && printf '\\xe9t\\xe9' > "
        "\"$(printf 'caf\\xe9.txt')\" && chmod +x src/calc.py"
    )
    assert (await sandbox.exec(setup)).exit_code == 0
    entries = {e.path: e for e in await sandbox.tree(hashes=True, prune=["build"])}
    assert not any(p == ".git" or p.startswith(".git/") for p in entries)
    calc = entries["src/calc.py"]
    assert calc.kind == "file" and calc.mode & 0o111
    assert calc.sha256 == hashlib.sha256(b"def add(a, b):\n    return a - b\n").hexdigest()
    assert entries["out"].kind == "link" and entries["out"].target == str(outside)
    assert not any(p.startswith("out/") for p in entries)  # a linked folder is not entered
    assert entries["calc-link"].kind == "link" and entries["calc-link"].target == "src/calc.py"
    assert entries["pipe"].kind == "special" and "FIFO" in (entries["pipe"].target or "")
    assert entries["nested"].kind == "repo" and "nested/inner.py" not in entries
    assert entries["build"].kind == "dir" and "build/deep" not in entries  # pruned
    latin = "caf\udce9.txt"  # an undecodable name, in surrogateescape form
    assert entries[latin].sha256 == hashlib.sha256(b"\xe9t\xe9").hexdigest()
    found = await sandbox.read_files([latin, "calc-link", "pipe", "out/secret.txt", "src/calc.py", "../x"])
    assert found[latin] == b"\xe9t\xe9" and found["src/calc.py"].startswith(b"def add")
    # Neither a link, a FIFO, a path through a linked folder nor one leaving the workspace is read.
    assert all(isinstance(found[p], str) for p in ("calc-link", "pipe", "out/secret.txt", "../x"))
    dirs = {e.path: e.kind for e in await sandbox.tree(dirs_only=True)}
    assert dirs["src"] == "dir" and dirs[".gitignore"] == "file" and "src/calc.py" not in dirs


async def test_put_writes_links_and_removes_but_never_through_a_link(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    assert (
        await sandbox.exec(f"ln -s {outside} out && mkdir -p gone/deep && touch gone/deep/f")
    ).exit_code == 0
    await sandbox.put(
        [
            Put("new/dir/tool.sh", "file", 0o755, b"#!/bin/sh\necho hi\n"),
            Put("README.md", "file", 0o644, b"\xe9\x00binary"),
            Put("link", "link", target="new/dir/tool.sh"),
            Put("gone", "absent"),
            Put("notes.txt", "absent"),
        ]
    )
    assert (await sandbox.exec("./new/dir/tool.sh && readlink link")).output == "hi\nnew/dir/tool.sh\n"
    assert await sandbox.read_file("/workspace/README.md") == b"\xe9\x00binary"
    assert (
        await sandbox.stat("/workspace/gone") is None and await sandbox.stat("/workspace/notes.txt") is None
    )
    with pytest.raises(OSError):
        await sandbox.put([Put("out/planted.txt", "file", 0o644, b"x")])
    with pytest.raises(ValueError):
        await sandbox.put([Put("../planted.txt", "file", 0o644, b"x")])
    assert list(outside.iterdir()) == []


async def test_copy_file_copies_dated_and_never_through_a_link(sandbox: Sandbox, tmp_path: Path) -> None:
    """The checkpoints' private index is made this way: the bytes, the given date, atomically;
    a missing source removes the copy; a link on the way (or a FIFO) is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    setup = "printf 'a\\0b' > src.bin && mkdir -p d && ln -s " + str(outside) + " out && mkfifo pipe"
    assert (await sandbox.exec(setup)).exit_code == 0
    assert await sandbox.copy_file("src.bin", "d/copy.bin", mtime_ns=1_000_000_000)
    assert await sandbox.read_file("/workspace/d/copy.bin") == b"a\0b"
    dated = await sandbox.exec("stat -c %Y d/copy.bin && ls d")
    assert dated.output == "1\ncopy.bin\n"  # second 1 of 1970, no temporary file left
    assert not await sandbox.copy_file("missing.bin", "d/copy.bin", mtime_ns=1_000_000_000)
    assert await sandbox.stat("/workspace/d/copy.bin") is None
    with pytest.raises(OSError):
        await sandbox.copy_file("src.bin", "out/planted.bin", mtime_ns=1_000_000_000)
    with pytest.raises(OSError):
        await sandbox.copy_file("pipe", "d/pipe.bin", mtime_ns=1_000_000_000)
    with pytest.raises(ValueError):
        await sandbox.copy_file("src.bin", "../planted.bin", mtime_ns=1_000_000_000)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_the_runner_never_imports_modules_of_the_workspace(kind: str, tmp_path: Path) -> None:
    """The runner starts in the workspace: a project with its own ``select.py`` or ``resource.py``
    (or a hostile one) must not be what the runner imports (``python -I``)."""
    planted = "raise SystemExit('imported from the workspace')\n"
    repo = make_repo(tmp_path / "repo", {"select.py": planted, "resource.py": planted, "ctypes.py": planted})
    async with create_sandbox(kind, sandbox_spec(repo)) as sandbox:
        result = await sandbox.exec("dd if=/dev/zero of=big bs=1M count=1 2>&1; echo done")
        assert result.output.endswith("done\n")
        assert await sandbox.stop_processes() == 0
