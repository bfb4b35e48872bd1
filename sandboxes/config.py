"""Per-repository sandbox configuration: ``.clover/config.toml`` in the repository.

```toml
[sandbox]
image = "my-project-sandbox:latest"   # Docker image for this repository (build it FROM
                                      # clover-agent-sandbox:latest so /workspace and uid 1000 exist)
setup = ["pip install -e ."]          # commands run in /workspace before the agent starts
setup_network = true                  # network only while the set-up commands run
```

Precedence for the image: ``SandboxSpec.image`` (``--image``), then the repository's file, then the
user's setting (``CLOVER_SANDBOX_IMAGE`` or ``[sandbox] image`` in the user config), then
``clover-agent-sandbox:latest``. Set-up commands in the file are used when the spec names none.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.errors import UsageError
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.settings import Settings

REPO_CONFIG = Path(".clover") / "config.toml"


@dataclass(frozen=True)
class RepoSandboxConfig:
    image: str | None = None
    setup: list[str] = field(default_factory=list)
    setup_network: bool = False


def repo_sandbox_config(repo: str | Path) -> RepoSandboxConfig:
    """The ``[sandbox]`` table of the repository's ``.clover/config.toml`` (empty when absent)."""
    path = Path(repo) / REPO_CONFIG
    if not path.is_file():
        return RepoSandboxConfig()
    try:
        with path.open("rb") as f:
            table = tomllib.load(f).get("sandbox", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [sandbox] must be a table")
    image, setup, network = table.get("image"), table.get("setup", []), table.get("setup_network", False)
    if image is not None and not isinstance(image, str):
        raise UsageError(f"{path}: [sandbox] image must be a string")
    if not (isinstance(setup, list) and all(isinstance(c, str) for c in setup)):
        raise UsageError(f"{path}: [sandbox] setup must be a list of command strings")
    if not isinstance(network, bool):
        raise UsageError(f"{path}: [sandbox] setup_network must be true or false")
    return RepoSandboxConfig(image=image, setup=setup, setup_network=network)


def effective_spec(spec: SandboxSpec) -> SandboxSpec:
    """``spec`` with the repository's configuration and the user's settings filled in; a
    repository folder that does not exist is a :class:`UsageError`, before any sandbox is made."""
    if not Path(spec.repo).is_dir():
        raise UsageError(f"the repository folder {spec.repo} does not exist or is not a folder")
    repo_config = repo_sandbox_config(spec.repo)
    image = spec.image or repo_config.image or Settings.load().sandbox_image
    if spec.setup_commands:
        return dataclasses.replace(spec, image=image)
    return dataclasses.replace(
        spec,
        image=image,
        setup_commands=list(repo_config.setup),
        setup_network=spec.setup_network or repo_config.setup_network,
    )
