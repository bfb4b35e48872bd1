"""Fixtures for the tool tests: a real git repository and real sandboxes (local, and Docker when an
engine and the image are there) started over it.

Sandboxes are module-scoped (a container start costs about a second): tests in one module share
one, so each test works on its own files and makes its own :class:`ToolContext` when it needs a
fresh shell session or edit history.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.factory import create_sandbox
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

SANDBOX_KINDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Python project; tests that need other files create them in the sandbox."""
    return make_repo(
        tmp_path_factory.mktemp("tools") / "repo",
        {
            "README.md": "# demo\n",
            "src/calc.py": "def add(a, b):\n    return a - b\n",
            "src/pkg/deep/inner.py": "X = 1\n",
            ".hidden/secret.txt": "hidden\n",
        },
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=SANDBOX_KINDS)
async def sandbox(request: pytest.FixtureRequest, repo: Path) -> AsyncIterator[Sandbox]:
    async with create_sandbox(request.param, sandbox_spec(repo)) as sb:
        yield sb
