"""What a hostile command can leave in the workspace or send to the runner, in every sandbox kind:
FIFOs, bad strings, huge files, forged answers, a full disk, sparse files, odd names. Each ends in a
clear error (or a correct answer) while the sandbox keeps working."""

from __future__ import annotations

import asyncio
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from clover_agent.sandboxes.base import FileTooLargeError, Sandbox, SandboxLimits, SpecialFileError
from clover_agent.sandboxes.errors import SandboxArgumentError, SandboxError
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.session import SessionSandbox
from clover_agent.sandboxes.workspace import SPARSE_MIN_HOLE
from tests.git_repos import git, make_repo
from tests.sandbox_specs import sandbox_spec

KINDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]
#: Generous: only a hang (the bug) takes longer.
DEADLINE_S = 60


async def alive(sandbox: Sandbox) -> None:
    assert (await sandbox.exec("echo alive", timeout=60)).output == "alive\n"


async def test_special_files_are_refused_never_opened(sandbox: Sandbox) -> None:
    await sandbox.exec("mkfifo pipe && ln -s pipe to_pipe && mkdir d && mkfifo d/inner")
    for path in ("/workspace/pipe", "/workspace/to_pipe"):
        with pytest.raises(SpecialFileError) as caught:
            await asyncio.wait_for(sandbox.read_file(path), DEADLINE_S)
        assert caught.value.kind == "FIFO (named pipe)" and caught.value.filename == path
        with pytest.raises(SpecialFileError):
            await asyncio.wait_for(sandbox.read_lines(path, 1, 10, max_bytes=1000), DEADLINE_S)
        with pytest.raises(SpecialFileError):
            await asyncio.wait_for(sandbox.write_file(path, b"x"), DEADLINE_S)
        entry = await sandbox.stat(path)
        assert entry is not None and entry.special == "FIFO (named pipe)" and not entry.is_dir
    assert (await sandbox.stat("/workspace/to_pipe")).is_symlink
    listed = {e.path: e.special for e in await sandbox.list_files("/workspace/d")}
    assert listed == {"/workspace/d/inner": "FIFO (named pipe)"}
    with pytest.raises(SpecialFileError, match="character device"):
        await sandbox.read_file("/dev/zero")  # never read forever
    assert (await sandbox.exec("test -p pipe && echo still a fifo")).output == "still a fifo\n"
    await alive(sandbox)


async def test_bad_strings_are_argument_errors_not_a_lost_sandbox(sandbox: Sandbox) -> None:
    bad_calls = [
        sandbox.exec("echo a\0b"),
        sandbox.exec("echo \ud800"),
        sandbox.exec("echo $X", env={"X": "a\0b"}),
        sandbox.exec("echo $X", env={"X=Y": "1"}),
        sandbox.exec("true", cwd="/workspace/\0"),
        sandbox.read_file("/workspace/a\0b"),
        sandbox.write_file("/workspace/\udfff.txt", b"x"),
        sandbox.stat("/workspace/x\0"),
    ]
    for call in bad_calls:
        with pytest.raises(SandboxArgumentError) as caught:
            await call
        assert (
            "NUL byte" in str(caught.value) or "surrogate" in str(caught.value) or "`=`" in str(caught.value)
        )
    await alive(sandbox)
    # An undecodable byte in a file name arrives in surrogateescape form and goes back the same way.
    await sandbox.exec("printf 'latin' > $'caf\\xe9.txt'")
    (name,) = [e.path for e in await sandbox.list_files("/workspace") if e.path.startswith("/workspace/caf")]
    assert name == "/workspace/caf\udce9.txt"
    assert await sandbox.read_file(name) == b"latin"


async def test_the_runner_survives_what_the_host_would_never_send(sandbox: Sandbox) -> None:
    """Defence in depth: a request that slipped past the host's checks, and a line that is not
    JSON, get an error answer; the runner neither crashes nor stops answering."""
    assert isinstance(sandbox, SessionSandbox) and sandbox._session is not None
    session = sandbox._session
    session._write(b"{this is not json\n")
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    request_id = 10_000
    session._pending[request_id] = (loop, future)
    raw = {"id": request_id, "op": "exec", "command": "echo a\0b", "timeout_s": 10, "env": {}, "cwd": None}
    session._write(json.dumps(raw).encode() + b"\n")
    answer = await asyncio.wait_for(future, DEADLINE_S)
    assert answer["ok"] is False and answer["error"] == "InvalidArgument"
    assert "null byte" in answer["message"]
    await alive(sandbox)


async def test_sizes_are_checked_before_content_moves(sandbox: Sandbox) -> None:
    size = 300 * 1000 * 1000
    made = await sandbox.exec(f"yes 'a line of text' | head -c {size} > big.log", timeout=300)
    assert made.exit_code == 0, made.output
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLargeError) as caught:
            await sandbox.read_file("/workspace/big.log")
        assert caught.value.size == size and caught.value.limit == 64 * 1024 * 1024
        lines = await sandbox.read_lines("/workspace/big.log", 1_000_000, 1_000_002, max_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024  # nothing near the file's 300 MB came to the host
    assert lines.data == b"a line of text\n" * 3 and (lines.first, lines.last) == (1_000_000, 1_000_002)
    assert lines.total_lines == size // len(b"a line of text\n") == 20_000_000 and lines.size == size
    assert not lines.binary and not lines.truncated
    cut = await sandbox.read_lines("/workspace/big.log", 1, -1, max_bytes=100)
    assert cut.truncated and len(cut.data) == 100 and cut.last == 7
    # Every request has a timeout: counting 20 million lines takes longer than 10 ms anywhere.
    assert isinstance(sandbox, SessionSandbox) and sandbox._session is not None
    with pytest.raises(TimeoutError, match=r"did not answer a `read_lines` request within 0\.01 s"):
        await sandbox._session.request(
            "read_lines", timeout=0.01, path="/workspace/big.log", first=1, last=-1, max_bytes=100
        )
    with pytest.raises(SandboxError, match="did not answer a `exec` request within 1 s"):
        await sandbox._session.request("exec", timeout=1, command="sleep 5", timeout_s=30, env={}, cwd=None)
    await sandbox.exec("rm big.log")
    # Listings stop at the number of entries asked for, and say how many there are.
    await sandbox.exec("mkdir many && cd many && touch $(seq -f 'f%04g' 1 3000)")
    listing = await sandbox.list_entries("/workspace/many", 1, max_entries=10)
    assert len(listing.entries) == 10 and listing.total == 3000 and listing.left_out == 2990


async def test_forged_answers_are_dropped(sandbox: Sandbox) -> None:
    """A command writing answers into the runner's output stream (in Docker through the init
    process's descriptors; locally through the runner's own, which its user may open) cannot make
    the host accept them: its own exec still gets its real output."""
    assert isinstance(sandbox, SessionSandbox) and sandbox._session is not None
    isolated = sandbox.warning is None
    forge = (
        "import json, os, sys\n"
        "line = ''.join(json.dumps({'id': i, 'ok': True, 'exit_code': 0, 'output': 'FORGED', 'timed_out': False,"
        " 'duration_s': 0, 'oom_killed': False, 'killed_reason': None, 'pid_limit_hit': False}) + '\\n'"
        " for i in range(1, 300))\n"
        "for target in sys.argv[1:]:\n"
        "    try:\n"
        "        with open(target.replace('PARENT', str(os.getppid())), 'w') as f:\n"
        "            f.write(line)\n"
        "        print('wrote', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, exc.strerror)\n"
    )
    targets = ["/proc/1/fd/1", "/proc/PARENT/fd/1"] if isolated else ["/proc/PARENT/fd/1"]
    await sandbox.write_file("/workspace/forge.py", forge.encode())
    result = await sandbox.exec("exec python3 forge.py " + " ".join(targets))
    assert result.exit_code == 0 and "FORGED" not in result.output
    if isolated:  # uid 1000 without capabilities: the init's stdout is open, the runner's is not
        assert result.output == "wrote /proc/1/fd/1\nrefused /proc/PARENT/fd/1 Permission denied\n"
    assert "wrote" in result.output and sandbox._session.dropped_lines >= 299
    assert (await sandbox.exec("echo real")).output == "real\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_sparse_file_stays_sparse_and_the_copy_never_balloons(kind: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "sparse", {"a.txt": "a\n"})
    apparent = 64 * 1024 * 1024
    with open(repo / "disk.img", "wb") as f:  # untracked: copied as the user has it
        f.truncate(apparent)
        f.seek(1_000_000)
        f.write(b"DATA")
        f.seek(apparent - 3)
        f.write(b"END")
    os.chmod(repo / "disk.img", 0o755)
    assert os.stat(repo / "disk.img").st_blocks * 512 < apparent - SPARSE_MIN_HOLE
    # 16 MiB of disk: the file fits only if its holes stay holes.
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=16 * 1024 * 1024))
    async with create_sandbox(kind, spec) as sandbox:
        check = await sandbox.exec(
            "stat -c '%s %a' disk.img; du -k disk.img | cut -f1; "
            "python3 -c \"f=open('disk.img','rb'); f.seek(1000000); print(f.read(4)); f.seek(-3, 2); print(f.read())\""
        )
        size_mode, allocated_kib, data, end = check.output.splitlines()
        assert size_mode == f"{apparent} 755"
        assert int(allocated_kib) < 1024
        assert (data, end) == ("b'DATA'", "b'END'")
        # Kept out of git, which would read it whole (and, on tmpfs, allocate every hole).
        git = await sandbox.exec("git status --porcelain; git ls-files disk.img; du -k disk.img | cut -f1")
        assert int(git.output) < 1024
        assert "disk.img" in (await sandbox.exec("cat .git/info/exclude")).output
        await sandbox.write_file("/workspace/a.txt", b"changed\n")
        patch = await sandbox.diff()
        assert "a.txt" in patch and "disk.img" not in patch


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tracked_sparse_file_counts_whole(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "tracked"
    root.mkdir()
    with open(root / "disk.img", "wb") as f:
        f.truncate(32 * 1024 * 1024)
    repo = make_repo(root / "repo", {"a.txt": "a\n"})
    os.replace(root / "disk.img", repo / "disk.img")
    git(repo, "add", "disk.img")
    git(repo, "commit", "-q", "-m", "image")
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=16 * 1024 * 1024))
    with pytest.raises(SandboxError, match="do not fit in the sandbox's disk limit"):
        async with create_sandbox(kind, spec):
            pass


@pytest.mark.parametrize("kind", KINDS)
async def test_a_workspace_over_the_disk_limit_is_refused_before_copying(kind: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "big", {"blob.bin": os.urandom(3 * 1024 * 1024)})
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=2 * 1024 * 1024))
    with pytest.raises(SandboxError, match=r"do not fit in the sandbox's disk limit of 0\.00 GiB") as caught:
        async with create_sandbox(kind, spec):
            pass
    assert "SandboxLimits.disk_bytes" in str(caught.value)


@pytest.mark.docker
async def test_docker_workspace_is_a_size_limited_tmpfs(repo: Path) -> None:
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=64 * 1024 * 1024))
    async with create_sandbox("docker", spec) as sandbox:
        fs = await sandbox.exec("stat -f -c '%T' /workspace; df -k --output=size /workspace | tail -1")
        kind, size_kib = fs.output.split()
        assert kind == "tmpfs" and int(size_kib) == 64 * 1024
        refused = await sandbox.exec("fallocate -l 3G big.img")
        assert refused.exit_code != 0 and "No space left on device" in refused.output
        assert refused.disk_full is not None and "/workspace has" in refused.disk_full
        filled = await sandbox.exec("head -c 100M /dev/zero > fill.bin", timeout=120)
        assert filled.exit_code != 0 and "/workspace is full" in (filled.disk_full or "")
        with pytest.raises(OSError) as caught:
            await sandbox.write_file("/workspace/more.txt", b"x" * 2_000_000)
        assert caught.value.errno == 28  # ENOSPC, as an ordinary file error
        freed = await sandbox.exec("rm fill.bin && echo freed")
        assert freed.output == "freed\n" and freed.disk_full is None
    assert SandboxLimits().disk_bytes == 2 * 1024**3


async def test_local_files_are_capped_at_the_disk_limit(repo: Path) -> None:
    spec = sandbox_spec(repo, limits=SandboxLimits(disk_bytes=8 * 1024 * 1024))
    async with create_sandbox("local", spec) as sandbox:
        big = await sandbox.exec("head -c 20M /dev/zero > big.bin; echo status=$?; stat -c %s big.bin")
        assert "status=153" in big.output  # killed by SIGXFSZ: 128 + 25
        assert int(big.output.split()[-1]) == 8 * 1024 * 1024
        assert big.disk_full is not None and "each file may be at most 8.0 MiB" in big.disk_full
        with pytest.raises(OSError) as caught:
            await sandbox.write_file("/workspace/huge.bin", b"x" * (9 * 1024 * 1024))
        assert caught.value.errno == 27  # EFBIG
        await alive(sandbox)


async def test_a_flood_into_the_runners_stream_is_dropped(sandbox: Sandbox) -> None:
    """450 MB without a line break, written into the runner's output stream: the host keeps at
    most its line limit (128 MiB, a few copies while a line is checked) in memory, and finds the
    real answer at the end of the flooded line."""
    assert isinstance(sandbox, SessionSandbox) and sandbox._session is not None
    target = "/proc/1/fd/1" if sandbox.warning is None else "/proc/$PPID/fd/1"
    tracemalloc.start()
    try:
        flood = await sandbox.exec(
            f"head -c 450000000 /dev/zero | tr '\\0' x > {target}; echo flooded", timeout=300
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert flood.output == "flooded\n"
    assert peak < 420 * 1024 * 1024 and sandbox._session.dropped_lines >= 1
    await alive(sandbox)
