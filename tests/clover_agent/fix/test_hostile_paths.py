"""Paths never handed back, whatever their case: on a case-insensitive file system (macOS,
Windows) the agent's ``.CLOVER/config.toml`` would land in the user's ``.clover/config.toml``."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.handback.paths import never_handed_back
from tests.git_repos import git


@pytest.mark.parametrize("path", [".clover/config.toml", ".CLOVER/config.toml", "sub/.Clover/config.toml",
                                  ".Git/hooks/pre-commit"])  # fmt: skip
def test_clover_and_git_folders_in_any_case_are_never_handed_back(tmp_path: Path, path: str) -> None:
    git(tmp_path, "init", "-q")
    found = never_handed_back(tmp_path, [path, "src/app.py"], excludes=b"", tracked=set())
    assert set(found) == {path} and "never handed back" in found[path]
