"""Fixtures for the sandbox tests: a real git repository with committed, modified, untracked and
ignored files, sandboxes of each kind started over it, and child processes holding one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from clover_agent.sandboxes import cleanup
from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from tests.cli_process import start_signalable
from tests.git_repos import git
from tests.sandbox_specs import sandbox_spec


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository: two commits, one uncommitted change, one untracked and one ignored file."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.name", "Test User")
    git(root, "config", "user.email", "test@example.com")
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "README.md").write_text("# demo\n")
    (root / ".gitignore").write_text("ignored.log\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    (root / "test_calc.py").write_text(
        "from src.calc import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "second")
    (root / "README.md").write_text("# demo\n\nuncommitted line\n")
    (root / "notes.txt").write_text("untracked\n")
    (root / "ignored.log").write_text("ignored\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    return root


HOLD = Path(__file__).with_name("hold_sandbox.py")
#: The host id the holder labels its container with (``hold_sandbox.py`` reads it).
HOLDER_HOST_ID = "HOLD_SANDBOX_HOST_ID"


@pytest.fixture
def own_leftovers(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Leftovers (of this test's holders) that only this test reaps; yields the host id.

    Every sandbox start and `sandbox prune` reap the leftovers of this machine's dead processes, so
    under pytest-xdist another worker's start would reap a killed holder's container or copy before
    the test looks at it, or hide a holder that failed to clean up. Here the test process and its
    holders count as a machine of their own (a unique host id in the containers' labels) and keep
    their local copies in a private temporary folder. Afterwards the containers labelled with that
    host id go (only a failed test leaves any)."""
    host = f"{cleanup.HOST_ID}-test-{uuid.uuid4().hex[:12]}"
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(cleanup, "HOST_ID", host)
    monkeypatch.setenv(HOLDER_HOST_ID, host)
    monkeypatch.setenv("TMPDIR", str(private_tmp))  # the holders' local copies
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))  # where this process reaps copies
    yield host
    if request.node.get_closest_marker("docker"):
        import docker

        from clover_agent.sandboxes.docker import LABEL_HOST, remove_containers

        client = docker.from_env()
        try:
            remove_containers(
                client, client.api.containers(all=True, filters={"label": f"{LABEL_HOST}={host}"})
            )
        finally:
            client.close()


def start_holder(kind: str, repo: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start a child process holding a sandbox (see ``hold_sandbox.py``); return it and the
    sandbox's identity (container id, or the local copy's host path) once it runs. SIGINT and
    SIGTERM are at their defaults in it (see ``start_signalable``). Needs :func:`own_leftovers`."""
    if HOLDER_HOST_ID not in os.environ:
        raise AssertionError("a test that starts a holder uses the own_leftovers fixture")
    child = start_signalable(
        [sys.executable, str(HOLD), kind, str(repo), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    if not line:
        raise AssertionError(f"holder failed: {child.stderr.read()}")
    return child, json.loads(line)["ready"]


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (``.git`` included) with its content, to prove nothing changed."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def sandbox(request: pytest.FixtureRequest, repo: Path) -> AsyncIterator[Sandbox]:
    """A started sandbox of each kind over :func:`repo`."""
    async with create_sandbox(request.param, sandbox_spec(repo)) as sb:
        yield sb
