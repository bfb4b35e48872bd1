"""Fixtures for the sandbox tests: a real git repository with committed, modified, untracked and
ignored files, and sandboxes of each kind started over it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clover_agent.sandboxes import Sandbox, create_sandbox
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


def start_holder(kind: str, repo: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start a child process holding a sandbox (see ``hold_sandbox.py``); return it and the
    sandbox's identity (container id, or the local copy's host path) once it runs. SIGINT and
    SIGTERM are at their defaults in it (see ``start_signalable``)."""
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
