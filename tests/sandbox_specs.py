"""Complete sandbox specs for tests, built the way the command line builds them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from clover_agent.launch import sandbox_spec as launch_spec
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.settings import Settings, repo_settings


def sandbox_spec(repo: str | Path, **fields: Any) -> SandboxSpec:
    """The spec ``clover-agent`` would make for ``repo`` (image from the repository's config, trusted,
    or the settings, its set-up commands, this process's environment), with ``fields`` replaced."""
    trusted = repo_settings(repo, trusted=True)
    return dataclasses.replace(launch_spec(Settings.load(), repo, repo_config=trusted), **fields)
