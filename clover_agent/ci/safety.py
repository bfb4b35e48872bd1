"""What a CI run lets into its sandbox: no secret from the environment, no push credential.

A CI job's environment is full of secrets (the model server's API key, ``GITHUB_TOKEN``, cloud
keys): the sandbox gets only :data:`SANDBOX_VARIABLES` (:func:`sandbox_environment`), and the API
key stays in this process with the backend. A CI job is also where a stored git credential is
worth most, so beyond the credential-free copy of ``.git``
(:mod:`clover_agent.sandboxes.git_config`) the bot refuses to start (exit 2) while
:func:`stored_credentials` finds one; the sandbox never has the network either. docs/ci.md
("Untrusted input") says what counts as a credential.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from clover_agent.sandboxes.git_config import (
    config_files,
    holds_credential,
    read_config,
    strip_credentials,
)

#: Host variables passed into the sandbox when set: none holds a secret, and tests may read them.
SANDBOX_VARIABLES = ("CI", "TZ", "LANG", "LC_ALL", "SOURCE_DATE_EPOCH")


#: With ``--sandbox local`` the commands also need the host's way to find its programs (this
#: machine's Python and its pytest): still no variable that holds a secret.
LOCAL_VARIABLES = ("PATH", "HOME", "USER", "VIRTUAL_ENV")


def sandbox_environment(host: Mapping[str, str]) -> dict[str, str]:
    """The variables set inside the sandbox: :data:`SANDBOX_VARIABLES` the host has, nothing else."""
    return {name: host[name] for name in SANDBOX_VARIABLES if host.get(name)}


def local_environment(host: Mapping[str, str]) -> dict[str, str]:
    """What the local sandbox's commands inherit: :data:`LOCAL_VARIABLES` the host has, nothing else."""
    return {name: host[name] for name in LOCAL_VARIABLES if host.get(name)}


def stored_credentials(repo: Path) -> list[str]:
    """The settings in the repository's own git configuration files (its submodules' and linked
    worktrees' included) that hold a credential, as ``file: key`` (values are never shown, nor user-info in a key)."""
    found = []
    for path in _config_files(repo):
        for key, value in read_config(path) or []:
            if holds_credential(key, value):
                found.append(f"{path}: {strip_credentials(key)}")  # a key may hold one too
    return found


def _config_files(repo: Path) -> list[Path]:
    """The repository's own configuration files: those of its common git folder (with the git
    folders inside it) and, in a linked worktree, that worktree's ``config.worktree``."""
    answer = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--path-format=absolute", "--git-common-dir", "--git-dir"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    if len(answer) != 2:
        return []
    common, own = Path(answer[0]), Path(answer[1])
    candidates = [*config_files(common), own / "config.worktree"]
    return [path for path in dict.fromkeys(candidates) if path.is_file()]
