"""What the copy into the sandbox holds, by size: a git-ignored virtual environment stays out, and a
large copy is announced with its size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.workspace import plan_workspace, write_workspace_tar
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

IMAGE = os.environ.get("CLOVER_SANDBOX_IMAGE", DEFAULT_SANDBOX_IMAGE)
MB = 1024**2


def repo_with_ignored_venv(root: Path) -> Path:
    repo = make_repo(
        root, {".gitignore": ".venv/\nbuild/\n", "app.py": "x = 1\n", "test_app.py": "def test(): pass\n"}
    )
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages" / "big"
    site.mkdir(parents=True)
    for i in range(5):  # 50 MB of incompressible bytes
        (site / f"blob{i}.so").write_bytes(os.urandom(10 * MB))
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_bytes(b"\0" * MB)
    return repo


def test_the_tar_holds_tracked_and_unignored_files_only(tmp_path: Path) -> None:
    repo = repo_with_ignored_venv(tmp_path / "r")
    (repo / "notes.txt").write_text("untracked, not ignored\n")
    plan = plan_workspace(repo)
    with (tmp_path / "copy.tar").open("wb") as out:
        write_workspace_tar(plan, out, uid=1000, gid=1000)
    assert plan.size < MB  # the ignored 51 MB stayed behind
    assert (tmp_path / "copy.tar").stat().st_size < 2 * MB
    assert plan.files >= 4 and 0 < plan.git_size < plan.size
    assert not any(rel.startswith((".venv", "build")) for _, rel, _ in plan.entries)


@pytest.mark.docker
async def test_a_git_ignored_50_mb_venv_does_not_enter_the_docker_sandbox(tmp_path: Path) -> None:
    repo = repo_with_ignored_venv(tmp_path / "r")
    messages: list[str] = []
    spec = sandbox_spec(repo, image=IMAGE, progress=messages.append)
    async with create_sandbox("docker", spec) as sb:
        listing = await sb.exec("ls -A /workspace; du -sk /workspace | cut -f1")
        names, kilobytes = listing.output.split()[:-1], int(listing.output.split()[-1])
        assert ".venv" not in names and "build" not in names
        assert {"app.py", "test_app.py", ".gitignore", ".git"} <= set(names)
        assert kilobytes < 2048, listing.output
        assert await sb.diff() == ""
    assert not any("copying the repository" in m for m in messages)  # small: nothing to announce


@pytest.mark.docker
async def test_a_large_copy_is_announced_with_its_size_and_the_git_folders_share(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"app.py": "x = 1\n"})
    (repo / "data.bin").write_bytes(os.urandom(25 * MB))  # untracked, not ignored: it is copied
    messages: list[str] = []
    async with create_sandbox("docker", sandbox_spec(repo, image=IMAGE, progress=messages.append)) as sb:
        assert (await sb.stat("/workspace/data.bin")).size == 25 * MB
    announced = [m for m in messages if m.startswith("copying the repository into the sandbox: ")]
    assert len(announced) == 1 and "25 MB in" in announced[0] and "the .git folder: 0 MB" in announced[0]
