"""Git on the host, run so that no repository (the user's, or one a sandbox shaped) runs code or
bends the output.

:func:`git` runs one command with no system or global configuration and none of this process's
``GIT_*`` variables (:func:`environment`), and with every setting that makes git run a program
(hooks, the fsmonitor, diff drivers, text conversion, the pager, credential helpers, filters...)
switched off the way ``-c`` does (:func:`config_environment`). The user's repository keeps its
local configuration otherwise (its ignore rules, its ``core.quotePath``): only what runs programs
is switched off.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from clover_agent.errors import CloverError

#: Seconds one host git command may take.
GIT_TIMEOUT_S = 300.0

_EMPTY_HOME = Path(tempfile.gettempdir()) / f"clover-agent-git-home-{os.getuid()}"

#: ``-c`` settings for every command: nothing git could run, nothing read from outside the repository.
SAFE_CONFIG = (
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "core.editor=false",
    "core.quotePath=true",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "credential.helper=",
    "diff.external=",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.renames=false",
    "color.ui=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.allow=never",
    "submodule.recurse=false",
    "status.showUntrackedFiles=all",
    "status.relativePaths=false",
    "status.submoduleSummary=false",
)


class HostGitError(CloverError):
    """A host git command failed: the message names the command and quotes git's words."""


def _home() -> Path:
    """An empty folder for ``HOME`` / ``XDG_CONFIG_HOME`` (and the hooks path), made once."""
    hooks = _EMPTY_HOME / "hooks"
    hooks.mkdir(parents=True, exist_ok=True, mode=0o700)
    return _EMPTY_HOME


def environment() -> dict[str, str]:
    """The environment host git runs with: no system or global configuration
    (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``), ``HOME`` and ``XDG_CONFIG_HOME`` at
    an empty folder, no ``GIT_*`` variable of this process (a ``GIT_DIR`` or ``GIT_INDEX_FILE`` of
    the caller's must not redirect it), no optional locks (``status`` does not rewrite the index)
    and messages in English (``LC_ALL=C``)."""
    home = str(_home())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_PAGER="cat",
        HOME=home,
        XDG_CONFIG_HOME=home,
        LC_ALL="C",
        LANG="C",
    )
    return env


def _filter_overrides(cwd: Path) -> list[tuple[str, str]]:
    """Settings emptying every filter driver the repository at ``cwd`` configures (reading
    configuration runs nothing); an empty command is no filter (git passes the bytes through)."""
    result = subprocess.run(
        ["git", "-C", str(cwd), "config", "--null", "--name-only", "--get-regexp", r"^filter\."],
        capture_output=True,
        env=environment(),
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    names = {  # filter.<name>.<key>: the name may hold dots itself
        key.split(".", 1)[1].rsplit(".", 1)[0]
        for key in result.stdout.decode("utf-8", "surrogateescape").split("\0")
        if key.count(".") >= 2
    }
    keys = (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false"))
    return [(f"filter.{name}.{key}", value) for name in sorted(names) for key, value in keys]


def config_environment(cwd: Path) -> dict[str, str]:
    """``GIT_CONFIG_COUNT`` / ``_KEY_n`` / ``_VALUE_n`` holding the safe settings for a command in
    ``cwd``: like ``-c``, they beat every configuration file, and any key (a filter name with ``=``
    or a line break in it) can be written.

    Off: hooks (``core.hooksPath`` at an empty folder), the fsmonitor, external diff drivers and
    text conversion (callers that diff also pass ``--no-ext-diff --no-textconv``), the pager,
    credential helpers, ``core.sshCommand``, ``core.attributesFile``; the filter drivers the
    repository's own configuration names (``filter.<name>.*``) are emptied one by one, since ``-c``
    can only override names it knows."""
    settings = [tuple(s.split("=", 1)) for s in SAFE_CONFIG]
    settings.append(("core.hooksPath", str(_home() / "hooks")))
    settings += _filter_overrides(cwd)
    env = {"GIT_CONFIG_COUNT": str(len(settings))}
    for i, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def git(
    cwd: Path,
    *args: str,
    input: bytes | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run a safe ``git -C cwd args...`` (bytes in and out). ``check``: raise
    :class:`HostGitError` on a non-zero exit; ``env``: extra variables (``GIT_LITERAL_PATHSPECS``
    where paths are given: a file named ``*`` or ``:(glob)x`` is then itself); ``timeout``:
    seconds (default :data:`GIT_TIMEOUT_S`)."""
    limit = GIT_TIMEOUT_S if timeout is None else timeout
    try:
        result = subprocess.run(
            ["git", "-C", str(cwd), *args],
            input=input,
            capture_output=True,
            env={**environment(), **config_environment(cwd), **(env or {})},
            timeout=limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise HostGitError(f"`git {' '.join(args[:2])}` in {cwd} did not finish in {limit:g} s") from None
    except OSError as exc:
        raise HostGitError(f"cannot run git: {exc.strerror}") from None
    if check and result.returncode != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[-1500:]
        raise HostGitError(
            f"`git {' '.join(args[:2])}` failed in {cwd}: {said or f'exit {result.returncode}'}"
        )
    return result


def z_list(output: bytes) -> list[str]:
    """NUL-separated paths (``-z`` output) as strings (undecodable bytes in ``surrogateescape``)."""
    return [p for p in output.decode("utf-8", "surrogateescape").split("\0") if p]
