"""Which paths a run may hand back to the user's tree, decided on the host: one place for ``fix``
and the CI bot (both through :meth:`clover_agent.handback.stock.Stock.record_end`) and the TUI's
``/apply``.

- :func:`never_handed_back`: ``.git`` and ``.clover`` (clover-agent's own records and settings),
  a name with control characters, and anything the *host's* git ignores — the user's
  ``.gitignore`` files as they are in their tree, ``info/exclude`` and the global excludes, never
  the workspace's (the agent can edit those). Shown and left out, whatever anyone answers.
- :func:`needs_yes`: git's own configuration files (``.gitattributes``, ``.gitignore``,
  ``.gitmodules``), CI and commit-hook configuration, and executable files: applied only on a
  person's yes at a terminal (``--yes`` alone leaves them out, named).
"""

from __future__ import annotations

import posixpath
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from clover_agent.handback.hostgit import git
from clover_agent.handback.shadow import EXECUTABLE

#: Folders never handed back, at any depth: git's own, and clover-agent's run records and settings.
NEVER_FOLDERS = (".git", ".clover")
#: Control characters a file name may not hold (a tab may: it moves nothing on a terminal); the
#: surrogates are undecodable C1 bytes (``0x80``-``0x9f``), which some terminals act on too.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\udc80-\udc9f]")
#: Files that change how git treats the tree.
GIT_FILES = frozenset({".gitattributes", ".gitignore", ".gitmodules"})
#: CI and hook configuration: a file whose commands run on the next push, commit or pipeline.
CI_FILES = frozenset({
    ".gitlab-ci.yml", ".travis.yml", "azure-pipelines.yml", "bitbucket-pipelines.yml", "Jenkinsfile",
    ".drone.yml", "appveyor.yml", ".appveyor.yml", ".woodpecker.yml", ".pre-commit-config.yaml",
})  # fmt: skip
CI_FOLDERS = (
    ".github/workflows/",
    ".github/actions/",
    ".gitlab/",
    ".circleci/",
    ".buildkite/",
    ".woodpecker/",
)


def _escaped(path: str) -> str:
    """``path`` with its control characters written as ``\\xNN`` (for a reason's text)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()) & 0xFF:02x}", path)


def _static_reason(path: str) -> str | None:
    if _CONTROL.search(path):
        return f"its name holds control characters ({_escaped(path)}): refused"
    parts = [part.casefold() for part in path.split("/")]  # .CLOVER is .clover on macOS and Windows
    for folder in NEVER_FOLDERS:
        if folder in parts:
            return f"inside {folder}/: never handed back"
    return None


def never_handed_back(
    repo: Path, paths: Iterable[str], *, excludes: bytes, tracked: set[str]
) -> dict[str, str]:
    """``path -> why`` for each of ``paths`` (relative to ``repo``, the user's tree) that is never
    handed back (see the module docstring). ``excludes``: the user's ignore patterns kept outside
    the tree (:func:`clover_agent.handback.snapshot.user_excludes`); ``tracked``: the paths the user's
    index tracks (git never ignores those)."""
    found: dict[str, str] = {}
    unknown = []
    for path in paths:
        why = _static_reason(path)
        if why is not None:
            found[path] = why
        elif path not in tracked:
            unknown.append(path)
    found.update(host_ignored(repo, unknown, excludes=excludes))
    return found


def host_ignored(repo: Path, paths: list[str], *, excludes: bytes) -> dict[str, str]:
    """``path -> why`` for each of ``paths`` that the user's tree ignores: ``git check-ignore``
    run in ``repo`` on the host (its ``.gitignore`` files as they are there, ``info/exclude``, and
    ``excludes`` as the excludes file), the paths given on stdin. Empty when ``repo`` is no git
    work tree (nothing is ignored there); when git fails, every path it did not answer for."""
    if not paths:
        return {}
    with tempfile.NamedTemporaryFile(prefix="clover-excludes-") as f:
        f.write(excludes)
        f.flush()
        result = git(
            repo,
            "-c", f"core.excludesFile={f.name}",  # beats the safe settings' /dev/null, as -c does
            "check-ignore", "-z", "-v", "--stdin",
            input=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths),
            check=False,
        )  # fmt: skip
        fields = result.stdout.decode("utf-8", "surrogateescape").split("\0")
        found = {}
        for i in range(0, len(fields) - 3, 4):  # source, line, pattern, path
            source, line, pattern, path = fields[i : i + 4]
            if pattern.startswith("!"):  # a negation matched: not ignored
                continue
            where = "your git excludes" if source == f.name else f"{source}:{line}"
            found[path] = f"ignored by your tree ({where}: {pattern}): never handed back"
    if result.returncode not in (0, 1) and _in_work_tree(repo):  # fail closed
        said = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no reason given"]
        why = (
            f"could not be checked against your tree's ignore rules (git: {said[0][:200]}): never handed back"
        )
        found.update({p: why for p in paths if p not in found})
    return found


def _in_work_tree(repo: Path) -> bool:
    result = git(repo, "rev-parse", "--is-inside-work-tree", check=False)
    return result.stdout.strip() == b"true"


def needs_yes(path: str, mode: int) -> str | None:
    """Why applying ``path`` with git mode ``mode`` needs a person's yes, or None (see the module
    docstring)."""
    name = posixpath.basename(path)
    if name in GIT_FILES:
        return f"{name}: changes how git treats your files"
    if path in CI_FILES or path.startswith(CI_FOLDERS):
        return "CI or hook configuration: runs on your next push or commit"
    if mode == EXECUTABLE:
        return "an executable file"
    return None
