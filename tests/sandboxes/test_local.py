"""What is particular to the local sandbox: its warning, path translation, and its private copy's
removal on close, on an exception, on signals, and (after SIGKILL) at the next start."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from clover_agent.sandboxes.local import LocalSandbox, reap_stale_copies
from tests.sandbox_specs import sandbox_spec

from .conftest import start_holder


async def test_warns_and_translates_paths(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    sandbox = LocalSandbox(sandbox_spec(repo))
    assert sandbox.warning is not None and "no isolation" in sandbox.warning
    async with sandbox:
        assert sandbox.warning in caplog.text
        host = sandbox.host_workspace
        assert host is not None and host.is_dir() and host != repo
        result = await sandbox.exec('echo "$WORKSPACE"; cd /workspace/src; pwd; ls /workspace/src')
        assert result.output == "/workspace\n/workspace/src\ncalc.py\n"
        # The copy is real: the command ran in the host folder the file tools map /workspace to.
        await sandbox.exec("echo made > /workspace/made.txt")
        assert (host / "made.txt").read_text() == "made\n"
        # Temporary files stay private to the sandbox too.
        tmp = Path((await sandbox.exec('touch "$TMPDIR/scratch"; printf %s "$TMPDIR"')).output)
        assert tmp.parent == host.parent and (tmp / "scratch").is_file()
    assert not host.exists() and not tmp.exists()


async def test_close_is_idempotent_and_removes_the_copy_after_an_exception(repo: Path) -> None:
    sandbox = LocalSandbox(sandbox_spec(repo))
    with pytest.raises(ZeroDivisionError):
        async with sandbox:
            host = sandbox.host_workspace
            1 / 0  # noqa: B018
    assert host is not None and not host.exists()
    await sandbox.close()


async def test_failing_setup_command_stops_the_start(repo: Path) -> None:
    sandbox = LocalSandbox(sandbox_spec(repo, setup_commands=["echo preparing", "exit 4"]))
    with pytest.raises(Exception, match=r"set-up command failed \(exit 4\): exit 4"):
        await sandbox.start()
    assert sandbox.host_workspace is not None and not sandbox.host_workspace.exists()


@pytest.mark.usefixtures("own_leftovers")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_removes_the_copy(repo: Path, signum: signal.Signals) -> None:
    child, ident = start_holder("local", repo)
    host = Path(ident)
    assert host.is_dir()
    child.send_signal(signum)
    assert child.wait(timeout=120) != 0
    assert not host.exists()


@pytest.mark.usefixtures("own_leftovers")
def test_sigkill_leftover_is_reaped_at_next_start(repo: Path) -> None:
    child, ident = start_holder("local", repo)
    host = Path(ident)
    child.kill()
    child.wait(timeout=120)
    assert host.exists()  # nothing could run in the killed process
    assert host.parent in reap_stale_copies()
    assert not host.exists()


async def test_a_folder_that_is_not_a_git_repository_is_copied_whole(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    (folder / "pkg" / "sub").mkdir(parents=True)
    (folder / "pkg" / "sub" / "mod.py").write_text("X = 1\n")
    (folder / "top.txt").write_text("top\n")
    async with LocalSandbox(sandbox_spec(folder)) as sandbox:
        listed = {e.path for e in await sandbox.list_files("/workspace", max_depth=3)}
        assert {"/workspace/pkg/sub/mod.py", "/workspace/top.txt"} <= listed
        assert await sandbox.read_file("/workspace/pkg/sub/mod.py") == b"X = 1\n"
        assert await sandbox.diff() == ""  # the copy got a starting commit of its own
        await sandbox.write_file("/workspace/top.txt", b"changed\n")
        assert "-top\n+changed" in await sandbox.diff()
    assert not (folder / ".git").exists()
