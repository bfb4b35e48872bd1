"""What a CI run lets into its sandbox: no secret from the environment, no push credential.

A CI job's environment is full of secrets (the model server's API key, ``GITHUB_TOKEN``, cloud
keys). The Docker sandbox already starts with a clean environment; the bot adds only the variables
of :data:`SANDBOX_VARIABLES` that the host has (none of them a secret), and hands the Docker client
only the engine's address, which never goes into the container. The API key stays in this process,
with the backend.

The sandbox gets a copy of the repository's ``.git`` folder, so a credential stored in its
configuration would go in with it: ``actions/checkout`` leaves the job's token there as an
``http.<url>.extraheader`` unless ``persist-credentials: false``, and a remote URL can hold
``user:token@``. :func:`stored_credentials` finds them, and the bot refuses to start (exit 2) until
they are gone. The sandbox never has the network either (``SandboxSpec.network`` is off), so
nothing could be pushed from it even with a credential.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

#: Host variables passed into the sandbox when set: none holds a secret, and tests may read them.
SANDBOX_VARIABLES = ("CI", "TZ", "LANG", "LC_ALL", "SOURCE_DATE_EPOCH")

#: A URL with a password or token in it: ``scheme://user:secret@host`` (``user@host`` alone is fine).
_URL_SECRET = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@", re.IGNORECASE)
#: A credential helper that keeps credentials in a file (``store``, ``store --file=...``).
_STORING_HELPER = re.compile(r"\bstore\b")


def sandbox_environment(host: Mapping[str, str]) -> dict[str, str]:
    """The variables set inside the sandbox: :data:`SANDBOX_VARIABLES` the host has, nothing else."""
    return {name: host[name] for name in SANDBOX_VARIABLES if host.get(name)}


def stored_credentials(repo: Path) -> list[str]:
    """The settings in the repository's own git configuration that hold a credential, as
    ``file: key`` (the values are never shown): HTTP headers (``http.*.extraheader``), credential
    helpers and their stores, URLs with a password or token."""
    found = []
    for path in _config_files(repo):
        # --file reads that one file: no includes, no system or global configuration.
        listed = subprocess.run(
            ["git", "config", "--file", str(path), "--null", "--list"],
            capture_output=True,
            text=True,
            check=False,
        )
        for entry in filter(None, listed.stdout.split("\0")):
            key, _, value = entry.partition("\n")
            lowered = key.lower()
            if (
                lowered.endswith(".extraheader")
                or (lowered.startswith("credential.") and _STORING_HELPER.search(value))
                or _URL_SECRET.search(value)
                or _URL_SECRET.search(key)  # url.<https://user:token@host/>.insteadOf
            ):
                found.append(f"{path}: {key}")
    return found


def _config_files(repo: Path) -> list[Path]:
    """The repository's own configuration files: ``config`` of its common git folder and, in a
    linked worktree, that worktree's ``config.worktree``."""
    answer = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--path-format=absolute", "--git-common-dir", "--git-dir"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    if len(answer) != 2:
        return []
    common, own = Path(answer[0]), Path(answer[1])
    candidates = [common / "config", common / "config.worktree", own / "config.worktree"]
    return [path for path in dict.fromkeys(candidates) if path.is_file()]
